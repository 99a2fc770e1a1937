"""The next-best terms of one e-class, from one greedy pass: each e-node of the class on top,
greedy's DAG-aware choice below it. They differ in their outermost step (for a matrix chain:
where it splits last). Linear in the e-graph plus a walk per alternative returned, instead of
one extraction per e-node of the class.

>>> from dlvm_eq.extract.graph import load_json
>>> g = load_json({"nodes": {
...     "x": {"op": "x", "children": [], "eclass": "X", "cost": 1.0},
...     "f": {"op": "f", "children": ["x"], "eclass": "R", "cost": 2.0},
...     "g": {"op": "g", "children": ["x"], "eclass": "R", "cost": 5.0}},
...     "root_eclasses": ["R"]})
>>> [(cost, g.node_ids[choice[g.roots[0]]]) for cost, choice in alternatives(g, g.costs, g.roots[0])]
[(3.0, 'f'), (6.0, 'g')]
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from . import cost_sets
from .choice import find_problem
from .graph import SerializedEGraph
from .greedy import greedy_dag_sets


def alternatives(
    graph: SerializedEGraph, costs: Sequence[float], root: int
) -> Iterator[tuple[float, list[int]]]:
    """(DAG cost, choice) per e-node of class `root` with a finite, acyclic term, cheapest
    first. Lazy: each choice is built and checked only when the caller asks for the next."""
    kids_of = graph.child_sets
    below = sorted({k for n in graph.class_nodes[root] for k in kids_of[n]} | {root})
    choice, sets = greedy_dag_sets(graph, costs, below)
    ranked = []
    for n in graph.class_nodes[root]:
        own = costs[n]
        if not math.isfinite(own) or any(sets[k] is None for k in kids_of[n]):
            continue
        merged = cost_sets.merged([sets[k] for k in kids_of[n]])  # cost_sets.py
        if cost_sets.contains(merged, root):  # the node needs its own class below it: a cycle
            continue
        ranked.append((own + cost_sets.total(merged), n))
    ranked.sort()
    for total, n in ranked:
        alt = list(choice)
        alt[root] = n
        if find_problem(graph, alt, [root])[1] is None:  # a stale greedy set may hide a cycle
            yield total, alt
