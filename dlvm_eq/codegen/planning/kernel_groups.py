"""Grouping a plan's materialized values into kernels (a mixin of the planner, like
rowfusion.RowFusion): values of the same iteration space become one multi-output kernel when
that creates no cycle through other steps and the kernel stays under MAX_KERNEL_NODES
expression nodes; a sibling output read element-for-element is computed once.
"""

from __future__ import annotations

import math

from ...ir.inline import KERNEL_EXPR_OPS
from ...ir.ops import LAYOUT, OPS
from ..kernels.kernel_spec import KernelInput, KernelSpec, ReduceSpec
from ..kernels.rows import Rebuilt, loads, rebuild
from ..kernels.spec import Expr, Load, walk
from .group_levels import GroupLevels
from .plan import KernelStep, step_inputs, step_outputs
from .rowfusion import short_op
from .steps_order import Node
from .values import EwOut, ReduceNode
from .views import NoView, is_contiguous, reshape_strides

# layout ops that keep every element: read through strides (concatenate, variadic, is copied)
VIEW_OPS = frozenset(n for n, s in OPS.items() if s.kind == LAYOUT and s.arity == 1)
# larger fused expressions are split (LLVM compile time grows quickly) where fusion's cost
# model expects it (ir/inline.py): scalar ops, each counted once however many read it
MAX_EXPR_NODES = KERNEL_EXPR_OPS
# A multi-output kernel holds at most this many expression nodes: LLVM's time grows faster than
# linearly with a function's size (a 3,000-op chain in one kernel: 48 s; in 300-op kernels: linear).
MAX_KERNEL_NODES = 2 * MAX_EXPR_NODES


class KernelGrouping:
    """Kernels from the planner's values: needs its `ew`, `ew_by_slot`, `reductions`, `steps`,
    `leaves`, `slots`, `op_of`, `pos_of` and `reindex`."""

    GROUP_CANDIDATES = 4  # recent kernels of the same space a value may join (plan time)

    def group(self) -> list[list[EwOut]]:
        """Materialized elementwise values -> multi-output kernels (same iteration space,
        no cycle through other steps)."""
        groups: list[list[EwOut]] = []
        group_in: list[set[int]] = []  # slots the members of a group read
        by_key: dict[tuple, list[int]] = {}
        producer_steps = {}
        for s in self.steps:
            for o in step_outputs(s):
                producer_steps[o] = set(step_inputs(s))
        for r in self.reductions:
            producer_steps[r.slot] = {self.leaves[i.index][0] for i in loads(r.body)}
        size: dict[int, int] = {}  # slot -> nodes of its expression
        for e in self.ew:
            nodes = walk([e.expr])
            size[e.slot] = len(nodes)
            e.reads = {self.leaves[ld.index][0] for ld in nodes if isinstance(ld, Load)}
        group_nodes: list[int] = []
        group_slots: list[set[int]] = []
        # stops the cycle check's search early (group_levels.py); None once a level is unknown
        self._levels: GroupLevels | None = GroupLevels(producer_steps, self.ew_by_slot, groups)
        for e in self.ew:
            key = tuple(d for d in e.shape if d != 1)
            placed = False
            for gi in reversed(by_key.get(key, [])[-self.GROUP_CANDIDATES :]):
                if group_nodes[gi] + size[e.slot] > MAX_KERNEL_NODES and groups[gi]:
                    continue
                if self.can_join(e, gi, groups, group_in, producer_steps):
                    groups[gi].append(e)
                    group_in[gi] |= e.reads
                    group_nodes[gi] += size[e.slot]
                    group_slots[gi].add(e.slot)
                    e.group = gi
                    placed = True
                    break
            if not placed:
                e.group = len(groups)
                groups.append([e])
                group_in.append(set(e.reads))
                group_nodes.append(size[e.slot])
                group_slots.append({e.slot})
                by_key.setdefault(key, []).append(e.group)
            if self._levels is not None and not self._levels.placed(
                e, e.group, group_slots[e.group]
            ):
                self._levels = None
        return groups

    def can_join(self, e: EwOut, gi: int, groups, group_in, producer_steps) -> bool:
        members = groups[gi]
        g_slots = {m.slot for m in members}
        shape = members[0].shape
        expr = e.expr if e.shape == shape else self.reshaped(e.expr, e.shape, shape)
        if expr is None:
            return False
        external = set()
        for ld in loads(expr):
            slot, st = self.leaves[ld.index]
            if slot in g_slots:
                if not is_contiguous(shape, st):
                    return False  # read at another element: needs the whole output first
                continue
            external.add(slot)
        # does an external input depend on the group (through other kernels and steps)? Not
        # through a slot whose level is not above the group's (group_levels.py)
        levels = getattr(self, "_levels", None)
        top = levels.group_level[gi] if levels is not None else None
        stack, seen = list(external), set()
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            if s in g_slots:
                return False
            if top is not None:
                lv = levels.of_slot(s)
                if lv is not None and lv <= top:
                    continue
            ew = self.ew_by_slot.get(s)
            if ew is not None:
                stack.extend(group_in[ew.group] if ew.group >= 0 else ew.reads)
            else:
                stack.extend(producer_steps.get(s, ()))
        return True

    def reshaped(self, expr: Expr, shape, to_shape):
        try:
            return self.reindex(expr, lambda st: reshape_strides(shape, st, to_shape))
        except NoView:
            return None

    def group_exprs(self, members: list[EwOut]) -> list[Expr]:
        """The members' expressions over the first member's shape (global Load ids); a sibling
        output read element-for-element is computed once, in registers. Computed once per
        group (the kernel and the row fusion both ask)."""
        done = self.__dict__.setdefault("_group_exprs", {})
        hit = done.get(id(members))
        if hit is not None and hit[0] is members:
            return hit[1]
        shape = members[0].shape
        by_slot = {}
        for m in members:
            by_slot[m.slot] = m.expr if m.shape == shape else self.reshaped(m.expr, m.shape, shape)
        resolved: dict[int, Expr] = {}
        # members are in the order they were written: a member loads only slots written before
        # it, so a node rebuilt for one member is rebuilt the same for every later one
        memo = Rebuilt()
        for m in members:
            resolved[m.slot] = self._substitute(by_slot[m.slot], resolved, shape, memo)
        exprs = [resolved[m.slot] for m in members]
        done[id(members)] = (members, exprs)
        return exprs

    def kernel_node(self, members: list[EwOut]) -> Node:
        shape = members[0].shape
        exprs = self.group_exprs(members)
        inputs, local = self._inputs(exprs, shape)
        memo = Rebuilt()  # the outputs share their DAG: each node localized once
        outs = [self._localize(e, local, memo) for e in exprs]
        names = tuple(m.name for m in members) + tuple(
            sorted(
                set().union(*(m.names for m in members)) - {m.name for m in members}, key=self._pos
            )
        )
        spec = KernelSpec(self._kernel_name(sorted(names, key=self._pos)), shape, inputs[1], outs)
        step = KernelStep(
            spec,
            tuple(inputs[0]),
            tuple(m.slot for m in members),
            names,
            min(m.order for m in members),
        )
        return Node(set(inputs[0]), [m.slot for m in members], step.order, step)

    def reduce_node(self, r: ReduceNode) -> Node:
        inputs, local = self._inputs([r.body], r.shape)
        fused = tuple(sorted(r.names - {r.name}, key=self._pos))
        spec = ReduceSpec(
            f"{short_op(r.op)}_" + self._kernel_name(fused, 2)
            if fused
            else f"reduce_{short_op(r.op)}",
            r.shape,
            inputs[1],
            self._localize(r.body, local),
            r.op,
            r.axes,
            r.init,
        )
        names = (r.name,) + fused
        step = KernelStep(spec, tuple(inputs[0]), (r.slot,), names, r.order)
        return Node(set(inputs[0]), [r.slot], r.order, step)

    def _pos(self, name: str) -> int:
        return self.pos_of.get(name, 1 << 30)

    def _kernel_name(self, names, limit: int = 3) -> str:
        """'add_relu_greaterThan': the distinct ops computed, in program order (views skipped)."""
        ops = []
        for n in names:
            op = self.op_of.get(n, "copy")
            if op not in ops and op not in VIEW_OPS and op != "literal":
                ops.append(op)
        return "_".join(ops[:limit]) or "copy"

    def _substitute(self, expr: Expr, resolved: dict[int, Expr], shape, memo: Rebuilt) -> Expr:
        """expr with its contiguous loads of resolved slots replaced by their expressions (memo:
        shared by the calls of one group, whose `resolved` only grows)."""
        if expr in memo.new:
            return memo.new[expr]
        repl = {}
        for ld in loads(expr, skip=memo.new):  # those under rebuilt nodes are replaced there
            slot, st = self.leaves[ld.index]
            if slot in resolved and is_contiguous(shape, st):
                repl[ld] = resolved[slot]
        return rebuild(expr, repl, memo) if repl or memo.new else expr

    def _inputs(self, exprs, shape):
        """(slots, KernelInputs) for the leaves of `exprs`, and global -> local Load ids."""
        slots, inputs, local = [], [], {}
        for ld in [e for e in walk(exprs) if isinstance(e, Load)]:
            slot, st = self.leaves[ld.index]
            info = self.slots[slot]
            contiguous = math.prod(info.shape) == math.prod(shape) and is_contiguous(shape, st)
            local[ld.index] = len(inputs)
            slots.append(slot)
            inputs.append(KernelInput(info.dtype, None if contiguous else st))
        return (slots, inputs), local

    def _localize(self, expr: Expr, local: dict[int, int], memo: Rebuilt | None = None) -> Expr:
        """expr with global Load ids replaced by the kernel's (memo: shared by one kernel's
        expressions; `local` maps every load of them)."""
        skip = () if memo is None else memo.new
        if expr in skip:
            return skip[expr]
        return rebuild(expr, {ld: Load(local[ld.index]) for ld in loads(expr, skip=skip)}, memo)
