"""Local search on a DAG extraction: switch e-classes' e-nodes while the DAG cost drops (the
greedy extractor's finishing pass).

Greedy keeps one cheapest cost set per class, so it misses choices that pay off only through
sharing between sibling classes. Here the whole chosen DAG is the state: every class has a
reference count (chosen parents + roots); switching class c from e-node n to n' adds n' and the
classes it newly reaches and removes those only n kept alive. The move is applied on the
reference counts, its delta read off, and undone unless the total drops. A move that makes a
class shared pays that class in full, so when a single move does not pay, the classes it
brings in are offered to other classes' e-nodes that read them (a pair move): that is how two
siblings come to share one value. A move is rejected when n' would reach c again (a cycle):
used classes carry a topological index (children first), so a child below c needs no search;
otherwise a depth-first search decides.

>>> from dlvm_eq.extract.graph import load_json
>>> from dlvm_eq.extract.greedy import greedy_dag_choice
>>> g = load_json({"nodes": {   # alone, a1 and b1 are cheapest; sharing s is cheaper for both
...     "s":  {"op": "s", "children": [], "eclass": "S", "cost": 6.0},
...     "a1": {"op": "a1", "children": [], "eclass": "A", "cost": 5.0},
...     "a2": {"op": "a2", "children": ["s"], "eclass": "A", "cost": 0.0},
...     "b1": {"op": "b1", "children": [], "eclass": "B", "cost": 5.0},
...     "b2": {"op": "b2", "children": ["s"], "eclass": "B", "cost": 0.0},
...     "r":  {"op": "r", "children": ["a1", "b1"], "eclass": "R", "cost": 1.0}},
...     "root_eclasses": ["R"]})
>>> ch = greedy_dag_choice(g, g.costs, g.roots)
>>> dag = lambda ch: sorted(g.node_ids[ch[c]] for c in _topological(g, ch, g.roots))
>>> dag(ch)
['a1', 'b1', 'r']
>>> dag(improve_choice(g, g.costs, ch, g.roots))
['a2', 'b2', 'r', 's']
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from ..cache import note_time_cut
from .graph import SerializedEGraph

MAX_PAIR_TRIES = 16  # second moves tried after one single move that does not pay
# the search's work budget: each tried switch counts one, plus the classes its walk raised or
# lowered, plus the used classes per re-index (about 10-20 us each when quiet: the cycle checks
# are not counted). The benchmark models' searches finish within 23k (an LSTM: 22k); a 32-step
# GRU's 6k-class e-graph needs ~128k (2-5 s) and stops at 30k, near where the 1-second cap
# stopped it when quiet. Counted, so that the choice is the same on a busy machine
WORK = 30_000


class _Cycle(Exception):
    pass


class _Search:
    def __init__(
        self,
        graph: SerializedEGraph,
        costs: Sequence[float],
        choice: list[int],
        roots: Sequence[int],
    ):
        self.g, self.costs, self.choice, self.roots = graph, costs, choice, roots
        self.kids = graph.child_sets
        self.refs = [0] * graph.num_classes
        for r in roots:
            self.refs[r] += 1
        for c in _topological(graph, choice, roots):
            for k in self.kids[choice[c]]:
                self.refs[k] += 1
        self.reindex()

    def reindex(self) -> None:
        self.topo = {c: i for i, c in enumerate(_topological(self.g, self.choice, self.roots))}

    def below(self, j: int, c: int, exact: bool, clear: set[int]) -> bool:
        """True when used class j cannot reach class c through the chosen e-nodes. `clear`
        holds classes already known not to reach c in this chosen DAG (one switch's searches
        share it, so each class is searched once a switch), and gains those searched here."""
        if j == c:
            return False
        if j in clear:
            return True
        if not exact:
            tj, tc = self.topo.get(j), self.topo.get(c)
            if tj is not None and tc is not None and tj < tc:
                return True
        kids, choice, refs = self.kids, self.choice, self.refs
        seen, stack = [j], [j]
        mark = {j}
        while stack:
            for y in kids[choice[stack.pop()]]:
                if y == c:
                    return False
                if y not in mark and y not in clear and refs[y] > 0:
                    mark.add(y)
                    seen.append(y)
                    stack.append(y)
        clear.update(seen)  # a finished search that missed c: nothing it saw reaches c
        return True

    def switch(self, c: int, alt: int, exact: bool = False) -> tuple[float, list[int], list[int]]:
        """Make e-node `alt` class c's choice: (cost delta, trail to undo it, classes that came
        alive). Raises _Cycle (with nothing changed) when alt would reach c."""
        refs, kids, choice, costs, below = self.refs, self.kids, self.choice, self.costs, self.below
        old = choice[c]
        trail: list[int] = []
        fresh: list[int] = []
        fresh_set: set[int] = set()
        gray: set[int] = set()
        clear: set[int] = set()  # used classes seen not to reach c (the DAG is fixed until the end)
        delta = costs[alt] - costs[old]
        stack: list = []
        topo_get, tc = self.topo.get, self.topo.get(c, -1)
        # the walk over alt's new classes, depth first; inline (no call per class: the hot loop)
        pending = top = iter(kids[alt])  # top: alt's own children, below any stack entry
        try:
            while True:
                for j in pending:
                    break
                else:
                    if not stack:
                        break  # alt's children all walked
                    gray.discard(stack.pop()[0])
                    pending = stack[-1][1] if stack else top
                    continue
                if refs[j] > 0:
                    if j in gray:
                        raise _Cycle
                    # below(), its topological shortcut first: most used children sit below c
                    if j not in fresh_set and (exact or topo_get(j, tc) >= tc):
                        if not below(j, c, exact, clear):
                            raise _Cycle
                    refs[j] += 1
                    trail.append(j)
                    continue
                n = choice[j]
                if n < 0:
                    raise _Cycle  # nothing chosen there: the class was never reachable
                refs[j] += 1
                trail.append(j)
                fresh.append(j)
                fresh_set.add(j)
                gray.add(j)
                delta += costs[n]
                pending = iter(kids[n])
                stack.append((j, pending))
        except _Cycle:
            self.undo(trail)
            raise
        release = list(kids[old])
        while release:
            k = release.pop()
            refs[k] -= 1
            trail.append(~k)
            if refs[k] == 0:
                delta -= costs[choice[k]]
                release.extend(kids[choice[k]])
        choice[c] = alt
        return delta, trail, fresh

    def undo(self, trail: list[int]) -> None:
        """Undo a trail's reference counts (k: a count raised, ~k: a count lowered)."""
        refs = self.refs
        for k in reversed(trail):
            if k >= 0:
                refs[k] -= 1
            else:
                refs[~k] += 1

    def revert(self, c: int, old: int, trail: list[int]) -> None:
        """Undo `switch(c, ...)`: class c's e-node back to `old`."""
        self.undo(trail)
        self.choice[c] = old

    def pays(self, delta: float, c: int) -> bool:
        return delta < -1e-12 * max(1.0, abs(self.costs[self.choice[c]]))


def improve_choice(
    graph: SerializedEGraph,
    costs: Sequence[float],
    choice: list[int],
    roots: Sequence[int],
    time_limit: float = 10.0,
    max_passes: int = 4,
    work: int | None = None,
) -> list[int]:
    """A valid, acyclic `choice` (per class an e-node index, -1 where unused) improved in place
    by single and pair switches until none lowers the DAG cost, `max_passes` passes over the
    used classes are done, or `work` (default WORK) is spent: the same choice on every machine.
    `time_limit` seconds is a safety net only; a search it stops is noted as a time cut
    (cache.note_time_cut). Returns the same list."""
    s = _Search(graph, costs, choice, roots)
    class_nodes, parents, node_class = graph.class_nodes, graph.parents, graph.node_class
    deadline = time.perf_counter() + time_limit
    spent, late = 0, False
    work = WORK if work is None else work
    for _ in range(max_passes):
        improved = False
        for c in list(s.topo):
            if s.refs[c] <= 0 or len(class_nodes[c]) < 2:
                continue
            if spent > work:
                break
            if time.perf_counter() > deadline:
                late = True
                break
            for alt in class_nodes[c]:
                old = choice[c]
                if alt == old or not math.isfinite(costs[alt]) or s.refs[c] <= 0:
                    continue
                spent += 1
                try:
                    delta, trail, fresh = s.switch(c, alt)
                except _Cycle:
                    continue
                spent += len(trail)
                if s.pays(delta, c) or _pair(s, c, delta, fresh, parents, node_class):
                    improved = True
                    s.reindex()
                    spent += len(s.topo)
                else:
                    s.revert(c, old, trail)
        if late:
            note_time_cut(f"extraction's local search: time limit ({time_limit:g} s) reached")
            break
        if not improved or spent > work:
            break
    for c in range(graph.num_classes):  # classes no longer reached keep no choice
        if s.refs[c] <= 0:
            choice[c] = -1
    return choice


def _pair(s: _Search, c: int, delta: float, fresh: list[int], parents, node_class) -> bool:
    """After switching c (cost delta, bringing in `fresh`), try one more switch of another used
    class to an e-node that reads a fresh class; keep both when together they pay."""
    tries = 0
    for f in fresh:
        for p in parents[f]:
            d = node_class[p]
            if d == c or s.refs[d] <= 0 or s.choice[d] == p or not math.isfinite(s.costs[p]):
                continue
            tries += 1
            if tries > MAX_PAIR_TRIES:
                return False
            old = s.choice[d]
            try:
                delta2, trail2, _ = s.switch(d, p, exact=True)
            except _Cycle:
                continue
            if s.pays(delta + delta2, c):
                return True
            s.revert(d, old, trail2)
    return False


def _topological(graph: SerializedEGraph, choice: Sequence[int], roots: Sequence[int]) -> list[int]:
    """The classes reachable from roots through the chosen e-nodes, children before parents."""
    kids_of = graph.child_sets
    out, seen = [], set()
    for r in roots:
        if r in seen:
            continue
        seen.add(r)
        stack = [(r, iter(kids_of[choice[r]]))]
        while stack:
            c, it = stack[-1]
            for k in it:
                if k not in seen:
                    seen.add(k)
                    stack.append((k, iter(kids_of[choice[k]])))
                    break
            else:
                stack.pop()
                out.append(c)
    return out
