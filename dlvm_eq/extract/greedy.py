"""DAG-aware greedy extraction (extraction-gym's "faster-greedy-dag"), the default extractor.

Each class keeps the cheapest *cost set* found so far: the classes its current term pulls in,
each with the cost of the node it uses there. A node's candidate set is the union of its
children's sets plus itself, so a value shared by two children is paid once; its cost is the
sum over the set. Sets are propagated from the leaves up with a priority worklist until
nothing improves. A node whose children's sets already contain its own class would close a
cycle and is skipped. The fixpoint can still leave a stale cycle in rare cases; those classes
are repaired with the tree extractor's (acyclic) choice, so the result is always valid.

>>> from dlvm_eq.extract.graph import load_json
>>> g = load_json({"nodes": {              # r1 needs x twice (through a and b): 7 as a DAG
...     "x":  {"op": "x", "children": [], "eclass": "X", "cost": 4.0},
...     "a":  {"op": "a", "children": ["x"], "eclass": "A", "cost": 1.0},
...     "b":  {"op": "b", "children": ["x"], "eclass": "B", "cost": 1.0},
...     "r1": {"op": "r1", "children": ["a", "b"], "eclass": "R", "cost": 1.0},
...     "r2": {"op": "r2", "children": [], "eclass": "R", "cost": 10.0}},
...     "root_eclasses": ["R"]})
>>> g.node_ids[greedy_dag_choice(g, g.costs, g.roots)[g.class_index["R"]]]
'r1'

Terms of more than SET_LIMIT classes keep sharing their cost set instead of copying it (tree
cost above that size): deep programs extract in linear time and memory.

Greedy is not optimal: each class keeps only its own cheapest set, so sharing that pays off
only across two sibling classes is missed (the ILP finds it).
"""
from __future__ import annotations

import heapq
import math
from typing import Sequence

from .choice import break_cycles
from .graph import SerializedEGraph
from .prune import leaf_worklist, reachable_classes
from .tree import tree_choice


# A cost set of more classes than this is shared by its users instead of copied: copying made
# deep programs quadratic in time and memory (a 10k-instruction chain: 50M set entries, 2.3 GB).
# Above the limit a term's total counts a value shared by two children once per child (tree
# cost), and a cycle the set no longer sees is repaired at the end like any stale one.
SET_LIMIT = 2048


def greedy_dag_choice(graph: SerializedEGraph, costs: Sequence[float], roots: Sequence[int]) -> list[int]:
    """Per class the chosen node index (-1 where no finite term or not reachable from ``roots``)."""
    choice, _ = greedy_dag_sets(graph, costs, roots)
    if any(choice[r] < 0 for r in roots):
        return choice  # the caller reports the unextractable root
    # Rare stale sets can leave a cycle among the final choices; repair with tree choices.
    break_cycles(graph, choice, tree_choice(graph, costs, roots)[0], roots)
    return choice


def greedy_dag_sets(graph: SerializedEGraph, costs: Sequence[float],
                    roots: Sequence[int]) -> tuple[list[int], list[dict | None]]:
    """(choice, sets): per class its chosen node and its cost set, {class: cost of the node
    used there} over the classes its term pulls in (None where it has no finite term). The
    choice may hold a rare stale cycle (greedy_dag_choice repairs it)."""
    inf = math.inf
    node_class, kids_of, parents = graph.node_class, graph.child_sets, graph.parents
    live = reachable_classes(graph, roots)
    ncls = graph.num_classes
    best = [inf] * ncls                  # total of the class's cost set
    sets: list[dict | None] = [None] * ncls  # class -> {class: cost of the node used there}
    choice = [-1] * ncls
    missing = [len(ks) for ks in kids_of]
    heap, queued = leaf_worklist(graph, costs, live)
    pop, push = heapq.heappop, heapq.heappush

    while heap:
        _, n = pop(heap)
        queued[n] = 0
        c = node_class[n]
        prev = best[c]
        own = costs[n]
        kids = kids_of[n]
        if not kids:
            if own >= prev:
                continue
            total, cset = own, {c: own}
        elif len(kids) == 1:
            k = kids[0]
            # Lower bound first: the union is at least the child's set, so most re-evaluations
            # are rejected before any set is copied.
            if own + best[k] >= prev:
                continue
            child = sets[k]
            if c in child:
                continue
            if len(child) > SET_LIMIT:
                cset = child               # shared, not copied (see SET_LIMIT)
            else:
                cset = child.copy()
                cset[c] = own
            total = best[k] + own
        else:
            big = kids[0]
            bound = best[big]
            for k in kids:
                b = best[k]
                if b > bound:
                    bound = b
            if own + bound >= prev:
                continue
            # Copy the largest child set and merge the others into it (C-level dict.update).
            big = max(kids, key=lambda k: len(sets[k]))
            if len(sets[big]) > SET_LIMIT:    # tree-like above the limit: shared, not copied
                if any(c in sets[k] for k in kids):
                    continue
                cset = sets[big]
                total = own + sum(best[k] for k in kids)
            else:
                cset = sets[big].copy()
                for k in kids:
                    if k != big:
                        cset.update(sets[k])
                if c in cset:
                    continue
                cset[c] = own
                total = sum(cset.values())
            if total >= prev:
                continue
        best[c] = total
        sets[c] = cset
        choice[c] = n
        first = prev == inf
        for p in parents[c]:
            if first:
                missing[p] -= 1
            if missing[p] == 0 and not queued[p] and costs[p] < inf and live[node_class[p]]:
                queued[p] = 1
                push(heap, (costs[p] + total, p))

    return choice, sets
