"""Shrinking an e-graph to what an extraction from given roots can use.

Drops e-nodes that can never be in a valid extraction (forbidden by an infinite cost, a child
that is their own class, a child class with no finite term), dominated e-nodes (another e-node
of the class is no dearer and needs a subset of its children), and classes not reachable from
the roots. The ILP is only tractable on what is left; the greedy extractors use the first steps.

>>> from dlvm_eq.extract.graph import load_json
>>> g = load_json({"nodes": {
...     "x": {"op": "x", "children": [], "eclass": "X", "cost": 1.0},
...     "y": {"op": "y", "children": [], "eclass": "Y", "cost": 1.0},
...     "f": {"op": "f", "children": ["x"], "eclass": "F", "cost": 1.0},
...     "g": {"op": "g", "children": ["x", "y"], "eclass": "F", "cost": 1.0},
...     "loop": {"op": "loop", "children": ["f"], "eclass": "F", "cost": 0.0}},
...     "root_eclasses": ["F"]})
>>> p = prune(g, g.costs, g.roots)
>>> [g.node_ids[n] for n in p.nodes], [g.class_ids[c] for c in p.classes]
(['x', 'f'], ['X', 'F'])
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence

from ..records import dataclass
from .graph import SerializedEGraph


def reachable_classes(
    graph: SerializedEGraph, roots: Iterable[int], node_ok: Sequence[bool] | None = None
) -> bytearray:
    """Mask of the classes reachable from ``roots`` through the allowed nodes."""
    seen = bytearray(graph.num_classes)
    kids_of, class_nodes = graph.child_sets, graph.class_nodes
    stack = []
    for r in roots:
        if not seen[r]:
            seen[r] = 1
            stack.append(r)
    while stack:
        c = stack.pop()
        for n in class_nodes[c]:
            if node_ok is not None and not node_ok[n]:
                continue
            for k in kids_of[n]:
                if not seen[k]:
                    seen[k] = 1
                    stack.append(k)
    return seen


def leaf_worklist(
    graph: SerializedEGraph, costs: Sequence[float], live: Sequence[int]
) -> tuple[list[tuple[float, int]], bytearray]:
    """The bottom-up extractors' starting heap: every finite-cost leaf e-node of a live class,
    as (cost, node), heapified; and the per-node "is queued" flags."""
    heap = []
    queued = bytearray(graph.num_nodes)
    kids_of = graph.child_sets
    for c in range(graph.num_classes):
        if live[c]:
            for n in graph.class_nodes[c]:
                if not kids_of[n] and costs[n] < math.inf:
                    heap.append((costs[n], n))
                    queued[n] = 1
    heapq.heapify(heap)
    return heap, queued


def extractable_classes(graph: SerializedEGraph, node_ok: Sequence[bool]) -> bytearray:
    """Mask of the classes that have a finite (acyclic) term using only allowed nodes: the least
    fixpoint of "some allowed node has all its children extractable"."""
    done = bytearray(graph.num_classes)
    kids_of, parents, node_class = graph.child_sets, graph.parents, graph.node_class
    missing = [len(ks) for ks in kids_of]
    ready = [n for n, ks in enumerate(kids_of) if not ks and node_ok[n]]
    while ready:
        c = node_class[ready.pop()]
        if done[c]:
            continue
        done[c] = 1
        for p in parents[c]:
            missing[p] -= 1
            if missing[p] == 0 and node_ok[p]:
                ready.append(p)
    return done


def strongly_connected(num: int, edges: Sequence[Sequence[int]]) -> list[int]:
    """Tarjan's SCCs, iteratively: ``comp[v]`` is the component number of vertex ``v``."""
    index = [-1] * num
    low = [0] * num
    comp = [-1] * num
    on_stack = bytearray(num)
    stack: list[int] = []
    counter = ncomp = 0
    for start in range(num):
        if index[start] >= 0:
            continue
        work = [(start, 0)]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack[start] = 1
        while work:
            v, i = work[-1]
            if i < len(edges[v]):
                work[-1] = (v, i + 1)
                w = edges[v][i]
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = 1
                    work.append((w, 0))
                elif on_stack[w] and index[w] < low[v]:
                    low[v] = index[w]
            else:
                work.pop()
                if work and low[v] < low[work[-1][0]]:
                    low[work[-1][0]] = low[v]
                if low[v] == index[v]:
                    while True:
                        w = stack.pop()
                        on_stack[w] = 0
                        comp[w] = ncomp
                        if w == v:
                            break
                    ncomp += 1
    return comp


@dataclass(frozen=True)
class Pruned:
    """What is left: node and class indices of the original graph, in increasing order."""

    nodes: tuple[int, ...]
    classes: tuple[int, ...]


def usable_nodes(graph: SerializedEGraph, costs: Sequence[float]) -> list[bool]:
    """Nodes that may appear in some valid extraction: finite cost, not their own child, and
    every child class extractable."""
    node_class, kids_of = graph.node_class, graph.child_sets
    ok = [
        math.isfinite(costs[n]) and node_class[n] not in kids_of[n] for n in range(graph.num_nodes)
    ]
    good = extractable_classes(graph, ok)
    return [ok[n] and all(good[k] for k in kids_of[n]) for n in range(graph.num_nodes)]


def prune(graph: SerializedEGraph, costs: Sequence[float], roots: Sequence[int]) -> Pruned:
    """The nodes and classes an optimal extraction from ``roots`` needs to consider."""
    ok = usable_nodes(graph, costs)
    _drop_dominated(graph, costs, ok)
    # Dropping nodes can only shrink reachability, never extractability (a dominating node
    # survives in each class), so one reachability pass after both steps is enough.
    seen = reachable_classes(graph, roots, ok)
    classes = tuple(c for c in range(graph.num_classes) if seen[c])
    nodes = tuple(n for c in classes for n in graph.class_nodes[c] if ok[n])
    return Pruned(nodes=tuple(sorted(nodes)), classes=classes)


def _drop_dominated(
    graph: SerializedEGraph, costs: Sequence[float], ok: list[bool], max_pairwise: int = 64
) -> None:
    """Drop node b when node a of the same class costs no more and needs a subset of b's child
    classes: any extraction using b stays valid (no new cycle) and no dearer with a instead."""
    kids_of = graph.child_sets
    for ns in graph.class_nodes:
        live = [n for n in ns if ok[n]]
        if len(live) < 2:
            continue
        # Cheapest first, ties by index, so that of two equal nodes the first one survives.
        live.sort(key=lambda n: (costs[n], n))
        if len(live) > max_pairwise:  # large classes: only exact duplicates of child sets
            seen_sets: set[frozenset[int]] = set()
            for n in live:
                key = frozenset(kids_of[n])
                if key in seen_sets:
                    ok[n] = False
                else:
                    seen_sets.add(key)
            continue
        kept: list[tuple[int, frozenset[int]]] = []
        for n in live:
            ks = frozenset(kids_of[n])
            if any(a_ks <= ks for _, a_ks in kept):
                ok[n] = False
            else:
                kept.append((n, ks))
