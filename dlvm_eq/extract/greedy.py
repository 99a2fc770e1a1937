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

Cost sets are persistent (cost_sets.py): a class's set is its child's plus one entry, sharing
the rest, and a union walks only where two sets differ, so deep programs extract in about
n log n time and memory with exact DAG costs at any depth.

Greedy is not optimal: each class keeps only its own cheapest set, so sharing that pays off
only across two sibling classes is missed (the ILP finds it).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from . import cost_sets
from .choice import break_cycles
from .cost_sets import SMALL
from .graph import SerializedEGraph
from .prune import leaf_worklist, reachable_classes
from .tree import tree_choice


def greedy_dag_choice(
    graph: SerializedEGraph, costs: Sequence[float], roots: Sequence[int]
) -> list[int]:
    """Per class the chosen node index (-1 where no finite term or not reachable from ``roots``)."""
    choice, _ = greedy_dag_sets(graph, costs, roots)
    if any(choice[r] < 0 for r in roots):
        return choice  # the caller reports the unextractable root
    # Rare stale sets can leave a cycle among the final choices; repair with tree choices.
    break_cycles(graph, choice, tree_choice(graph, costs, roots)[0], roots)
    return choice


def greedy_dag_sets(
    graph: SerializedEGraph, costs: Sequence[float], roots: Sequence[int]
) -> tuple[list[int], list[cost_sets.CostSet]]:
    """(choice, sets): per class its chosen node and its cost set, {class: cost of the node
    used there} over the classes its term pulls in (None where it has no finite term). The
    choice may hold a rare stale cycle (greedy_dag_choice repairs it). A set is a persistent
    cost_sets.CostSet: read it with cost_sets.contains, total, items."""
    node_class, kids_of = graph.node_class, graph.child_sets
    live = reachable_classes(graph, roots)
    ncls = graph.num_classes
    best = [math.inf] * ncls  # total of the class's cost set
    sets: list = [None] * ncls  # class -> its cost set (cost_sets.py)
    choice = [-1] * ncls
    missing = [len(ks) for ks in kids_of]  # per node: children without a term yet
    heap, queued = leaf_worklist(graph, costs, live)
    pop, best_of = heapq.heappop, best.__getitem__
    while heap:
        _, n = pop(heap)
        queued[n] = 0
        c = node_class[n]
        kids = kids_of[n]
        own = costs[n]
        # Lower bound first: a node's set is at least its dearest child's, so most
        # re-evaluations are rejected before any set is built.
        if len(kids) == 1:
            k = kids[0]
            if own + best[k] >= best[c]:
                continue
            found = _one_child_set(c, own, k, best, sets)
        elif kids:
            if own + max(map(best_of, kids)) >= best[c]:
                continue
            found = _merged_set(c, own, kids, best, sets)
        elif own >= best[c]:
            continue
        else:
            found = own, {c: own}
        if found is None:
            continue
        first = best[c] == math.inf
        best[c], sets[c] = found
        choice[c] = n
        _queue_parents(graph, costs, live, c, found[0], first, missing, queued, heap)
    return choice, sets


def _one_child_set(c: int, own: float, k: int, best: list, sets: list) -> tuple | None:
    """(total, cost set) of a node of class c (costing `own`, cheaper than c's current set by
    the lower bound) with the one child class k, or None when it would close a cycle."""
    child = sets[k]
    if type(child) is dict and len(child) < SMALL:  # the common small case, inline
        if c in child:
            return None
        cset = child.copy()
        cset[c] = own
        return best[k] + own, cset
    if cost_sets.contains(child, c):
        return None
    return best[k] + own, cost_sets.added(child, c, own)


def _merged_set(c: int, own: float, kids, best: list, sets: list) -> tuple | None:
    """(total, cost set) of a node of class c with several child classes: the union of their
    sets (a class shared by two children paid once), or None when no cheaper or cyclic."""
    # the largest child set first, then the others in order (a later child's cost of a class
    # wins, as dict.update's did when these were all dicts)
    if all(type(sets[k]) is dict for k in kids):  # the common small case, inline
        big = max(kids, key=lambda k: len(sets[k]))
        cset = sets[big].copy()
        for k in kids:
            if k != big:
                cset.update(sets[k])
        if len(cset) < SMALL:
            if c in cset:
                return None
            cset[c] = own
            total = sum(cset.values())
            return (total, cset) if total < best[c] else None
    big = max(kids, key=lambda k: cost_sets.size(sets[k]))
    cset = cost_sets.merged([sets[big]] + [sets[k] for k in kids if k != big])
    if cost_sets.contains(cset, c):
        return None
    cset = cost_sets.added(cset, c, own)
    total = cost_sets.total(cset)
    return (total, cset) if total < best[c] else None


def _queue_parents(
    graph: SerializedEGraph,
    costs,
    live,
    c: int,
    total: float,
    first: bool,
    missing: list,
    queued,
    heap: list,
) -> None:
    """Class c has a new, cheaper set: queue the parent nodes all of whose children now have
    a term (on its first set, c counts as one more such child for each of them)."""
    node_class, push, inf = graph.node_class, heapq.heappush, math.inf
    for p in graph.parents[c]:
        if first:
            missing[p] -= 1
        if missing[p] == 0 and not queued[p] and costs[p] < inf and live[node_class[p]]:
            queued[p] = 1
            push(heap, (costs[p] + total, p))
