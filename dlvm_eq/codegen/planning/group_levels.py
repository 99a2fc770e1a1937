"""Levels of the grouped step graph, for kernel_groups' cycle check (a helper of
KernelGrouping.group): every kernel group and every other step output gets a level above the
levels of what it reads, so a slot whose level is not above a group's cannot depend on that
group, and the check's backward search stops there instead of walking back to the program's
start (it did: quadratic in a chain's length, 20 s of a 1,024-layer tanh chain's plan under
cProfile).

    levels = GroupLevels(producer_steps, ew_by_slot, groups)
    levels.placed(e, gi, group_slots)    # after e joined (or started) group gi
    levels.of_slot(s)                     # None: unknown (no stop there)

A group's level rises when a member reading something higher joins it; what reads the group
then rises too (a worklist, no recursion). Units: ("g", group index) or ("s", step output slot).
"""

from __future__ import annotations


class GroupLevels:
    """Levels of groups and step outputs: level(reader) > level(read) across units."""

    def __init__(self, producer_steps: dict, ew_by_slot: dict, groups: list):
        self.producer_steps = producer_steps  # step/reduction output slot -> its input slots
        self.ew_by_slot = ew_by_slot
        self.groups = groups  # the grouping's list of member lists (filled as it goes)
        self.group_level: list[int] = []
        self.step_level: dict[int, int] = {}
        self.readers: dict[int, list[tuple]] = {}  # slot -> units whose level counts it

    def of_slot(self, s: int) -> int | None:
        ew = self.ew_by_slot.get(s)
        if ew is not None:
            return self.group_level[ew.group] if 0 <= ew.group < len(self.group_level) else None
        if s not in self.producer_steps:
            return 0  # a parameter, constant or view: reads nothing
        return self._step(s)

    def _step(self, s: int) -> int | None:
        """The level of step output s (computed once, iteratively through steps reading steps)."""
        stack = [s]
        while stack:
            t = stack[-1]
            if t in self.step_level:
                stack.pop()
                continue
            ins = self.producer_steps[t]
            todo = [i for i in ins if i in self.producer_steps and i not in self.step_level]
            if todo:
                stack.extend(todo)
                continue
            levels = [self.of_slot(i) for i in ins]
            if any(lv is None for lv in levels):
                return None  # reads a value not grouped yet: no level, no stop
            stack.pop()
            self.step_level[t] = 1 + max(levels, default=0)
            for i in ins:
                self.readers.setdefault(i, []).append(("s", t))
        return self.step_level[s]

    def placed(self, e, gi: int, group_slots: set) -> bool:
        """e (an EwOut) is now a member of group gi (a new group when gi == len(levels)):
        raise the group above e's reads from outside it. False when a read has no level."""
        reads = [x for x in e.reads if x not in group_slots]
        levels = [self.of_slot(x) for x in reads]
        if any(lv is None for lv in levels):
            return False
        need = 1 + max(levels, default=0)
        if gi == len(self.group_level):
            self.group_level.append(need)
        else:
            self._raise(("g", gi), need)
        for x in reads:
            self.readers.setdefault(x, []).append(("g", gi))
        return True

    def _raise(self, unit: tuple, level: int) -> None:
        work = [(unit, level)]
        while work:
            (kind, key), lv = work.pop()
            if kind == "g":
                if lv <= self.group_level[key]:
                    continue
                self.group_level[key] = lv
                slots = [m.slot for m in self.groups[key]]
            else:
                if lv <= self.step_level[key]:
                    continue
                self.step_level[key] = lv
                slots = [key]
            for s in slots:
                for r in self.readers.get(s, ()):
                    work.append((r, lv + 1))
