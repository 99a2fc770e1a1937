"""Bottom-up tree-cost extraction: the classic baseline (egg's and egglog's default extractor).

A class costs its cheapest node plus the costs of that node's children, each child counted
once per use: ``f(x, x)`` pays for ``x`` twice. It therefore over-counts shared values, which
is why the DAG extractors exist; it is also the safe fallback they repair cycles with.

>>> from dlvm_eq.extract.graph import load_json
>>> g = load_json({"nodes": {
...     "x": {"op": "x", "children": [], "eclass": "X", "cost": 1.0},
...     "f": {"op": "f", "children": ["x"], "eclass": "F", "cost": 1.0},
...     "g": {"op": "g", "children": [], "eclass": "F", "cost": 5.0}},
...     "root_eclasses": ["F"]})
>>> choice, best = tree_choice(g, g.costs, g.roots)
>>> g.node_ids[choice[g.class_index["F"]]], best[g.class_index["F"]]
('f', 2.0)
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from .graph import SerializedEGraph
from .prune import leaf_worklist, reachable_classes


def tree_choice(graph: SerializedEGraph, costs: Sequence[float], roots: Sequence[int]):
    """``(choice, best)``: per class its cheapest-tree node (or -1) and that tree's cost (or inf).

    Only classes reachable from ``roots`` are computed. With costs >= 0 and strict improvement,
    the result is acyclic: a class's final value was set after all its children's final values.
    Nodes are evaluated cheapest-estimate first (as in Knuth's generalized Dijkstra), so most
    classes settle on their first evaluation.
    """
    inf = math.inf
    node_class, children, kids_of, parents = (
        graph.node_class,
        graph.children,
        graph.child_sets,
        graph.parents,
    )
    live = reachable_classes(graph, roots)
    best = [inf] * graph.num_classes
    choice = [-1] * graph.num_classes
    missing = [len(ks) for ks in kids_of]  # child classes of a node still without a finite cost
    heap, queued = leaf_worklist(graph, costs, live)
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        _, n = pop(heap)
        queued[n] = 0
        c = node_class[n]
        total = costs[n]
        for k in children[n]:
            total += best[k]
        if total >= best[c]:
            continue
        first = best[c] == inf
        best[c] = total
        choice[c] = n
        for p in parents[c]:
            if first:
                missing[p] -= 1
            if missing[p] == 0 and not queued[p] and costs[p] < inf and live[node_class[p]]:
                queued[p] = 1
                push(heap, (costs[p] + total, p))
    return choice, best
