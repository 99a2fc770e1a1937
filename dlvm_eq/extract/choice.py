"""Walking a choice (one e-node per e-class) from the roots: validity, DAG cost, tree cost.

A choice here is a list indexed by class, holding a node index or -1 (no choice). The public
string-keyed versions live in ``dlvm_eq.extract`` (``validate``, ``dag_cost``).

>>> from dlvm_eq.extract.graph import load_json
>>> g = load_json({"nodes": {
...     "x": {"op": "x", "children": [], "eclass": "X", "cost": 1.0},
...     "f": {"op": "f", "children": ["x", "x"], "eclass": "F", "cost": 2.0}},
...     "root_eclasses": ["F"]})
>>> order = walk(g, [0, 1], g.roots)      # class X picks node 0 ("x"), class F node 1 ("f")
>>> [g.class_ids[c] for c in order], dag_cost_of(g.costs, [0, 1], order), tree_cost_of(g, g.costs, [0, 1], order, g.roots)
(['X', 'F'], 3.0, 4.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .extraction_error import ExtractionError
from .graph import SerializedEGraph

NONE = -1  # "no e-node chosen" in an integer choice list


def find_problem(graph: SerializedEGraph, choice: Sequence[int], roots: Sequence[int]):
    """Depth-first walk from the roots along the chosen nodes.

    Returns ``(order, problem)``: the reached classes children-first, and ``None`` or
    ``("missing", [c])`` or ``("cycle", [c1, ..., ck])`` for the first problem met.
    Iterative, because real e-graphs are deeper than Python's recursion limit.
    """
    kids_of = graph.child_sets
    state = bytearray(graph.num_classes)  # 0 unseen, 1 on the stack, 2 done
    order: list[int] = []
    for r in roots:
        if state[r]:
            continue
        if choice[r] < 0:
            return order, ("missing", [r])
        state[r] = 1
        stack = [r]
        pos = [0]
        while stack:
            c = stack[-1]
            kids = kids_of[choice[c]]
            i = pos[-1]
            if i < len(kids):
                pos[-1] = i + 1
                k = kids[i]
                s = state[k]
                if s == 0:
                    if choice[k] < 0:
                        return order, ("missing", [k])
                    state[k] = 1
                    stack.append(k)
                    pos.append(0)
                elif s == 1:
                    return order, ("cycle", stack[stack.index(k) :])
            else:
                state[c] = 2
                order.append(c)
                stack.pop()
                pos.pop()
    return order, None


def walk(graph: SerializedEGraph, choice: Sequence[int], roots: Sequence[int]) -> list[int]:
    """The classes reached from ``roots``, children first; raises if one lacks a choice or
    the chosen nodes form a cycle."""
    order, problem = find_problem(graph, choice, roots)
    if problem is None:
        return order
    kind, classes = problem
    names = [graph.class_ids[c] for c in classes]
    if kind == "missing":
        raise ExtractionError(
            f"e-class {names[0]!r} is reachable from the roots but has no chosen e-node"
        )
    path = " -> ".join(f"{graph.class_ids[c]} ({graph.ops[choice[c]]})" for c in classes)
    raise ExtractionError(f"the chosen e-nodes form a cycle: {path} -> {names[0]}")


def dag_cost_of(costs: Sequence[float], choice: Sequence[int], order: Sequence[int]) -> float:
    """Each chosen node reached counts once; fsum so the same set gives the same number in
    any order (extractors are compared on it)."""
    return math.fsum(costs[choice[c]] for c in order)


def tree_cost_of(
    graph: SerializedEGraph,
    costs: Sequence[float],
    choice: Sequence[int],
    order: Sequence[int],
    roots: Sequence[int],
) -> float:
    """The cost of the terms unfolded as trees: a child used twice counts twice. ``order`` is
    children-first (from :func:`walk`), so one pass suffices."""
    children = graph.children
    tree: dict[int, float] = {}
    for c in order:
        n = choice[c]
        tree[c] = costs[n] + sum(tree[k] for k in children[n])
    return math.fsum(tree[r] for r in dict.fromkeys(roots))


def break_cycles(
    graph: SerializedEGraph, choice: list[int], safe: Sequence[int], roots: Sequence[int]
) -> int:
    """Make ``choice`` valid by falling back to ``safe`` (a valid, acyclic choice for every
    extractable class, e.g. the tree extractor's) on the classes of each cycle found.

    Each round moves at least one class of a cycle onto ``safe`` (the safe choices alone form no
    cycle), so it ends. Returns how many classes were changed.
    """
    changed = 0
    while True:
        _, problem = find_problem(graph, choice, roots)
        if problem is None:
            return changed
        for c in problem[1]:
            if safe[c] < 0:
                raise ExtractionError(f"e-class {graph.class_ids[c]!r} has no extractable e-node")
            if choice[c] != safe[c]:
                choice[c] = safe[c]
                changed += 1


def chosen_cycles(
    graph: SerializedEGraph, choice: Sequence[int], roots: Sequence[int]
) -> list[list[int]]:
    """Cycles of the chosen nodes reached from ``roots``, one per back edge of a depth-first
    walk (so every cyclic part yields at least one), each as classes ``[c1, ..., ck]`` where
    ``c(i+1)`` is a child of ``ci``'s chosen node and ``c1`` a child of ``ck``'s."""
    kids_of = graph.child_sets
    state = bytearray(graph.num_classes)
    cycles: list[list[int]] = []
    for r in roots:
        if state[r] or choice[r] < 0:
            continue
        state[r] = 1
        stack, pos = [r], [0]
        where = {r: 0}  # class -> its position on the stack
        while stack:
            c = stack[-1]
            kids = kids_of[choice[c]]
            i = pos[-1]
            if i < len(kids):
                pos[-1] = i + 1
                k = kids[i]
                if state[k] == 0 and choice[k] >= 0:
                    state[k] = 1
                    where[k] = len(stack)
                    stack.append(k)
                    pos.append(0)
                elif state[k] == 1:
                    cycles.append(stack[where[k] :])
            else:
                state[c] = 2
                del where[c]
                stack.pop()
                pos.pop()
    return cycles
