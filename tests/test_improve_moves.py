"""extract/improve.py's local search takes exactly the moves of its straightforward form.

The search was sped up (the walk inlined, one switch's cycle searches sharing what they saw,
the topological shortcut read before a call): the compiled programs must not change. `_reference_improve` below is the search as it was written before
(session 17), a move at a time with a fresh depth-first search per cycle check; both must end
on the same choice for every class, on random e-graphs (cycles included) and on Tensat's.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlvm_eq.extract import load_json
from dlvm_eq.extract.greedy import greedy_dag_choice
from dlvm_eq.extract.improve import MAX_PAIR_TRIES, improve_choice

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "extraction-gym"


class _Cycle(Exception):
    pass


def _topological(g, choice, roots):
    out, seen = [], set()

    def visit(c):  # recursion is fine here: test graphs are small or shallow
        seen.add(c)
        for k in g.child_sets[choice[c]]:
            if k not in seen:
                visit(k)
        out.append(c)

    for r in roots:
        if r not in seen:
            visit(r)
    return out


def _reference_improve(g, costs, choice, roots, max_passes=4):
    kids, parents, node_class = g.child_sets, g.parents, g.node_class
    refs = [0] * g.num_classes
    for r in roots:
        refs[r] += 1
    for c in _topological(g, choice, roots):
        for k in kids[choice[c]]:
            refs[k] += 1

    def reaches(j, c):  # j reaches c through chosen e-nodes of used classes
        seen, todo = set(), [j]
        while todo:
            x = todo.pop()
            if x == c:
                return True
            if x not in seen:
                seen.add(x)
                todo.extend(y for y in kids[choice[x]] if refs[y] > 0)
        return False

    def switch(c, alt):
        old, trail, fresh, gray = choice[c], [], [], set()
        delta = [costs[alt] - costs[old]]

        def touch(j):
            if refs[j] > 0:
                if j in gray or (j not in fresh and reaches(j, c)):
                    raise _Cycle
                refs[j] += 1
                trail.append(j)
                return
            if choice[j] < 0:
                raise _Cycle
            refs[j] += 1
            trail.append(j)
            fresh.append(j)
            gray.add(j)
            delta[0] += costs[choice[j]]
            for y in kids[choice[j]]:
                touch(y)
            gray.discard(j)

        try:
            for j in kids[alt]:
                touch(j)
        except _Cycle:
            undo(trail)
            raise
        release = list(kids[old])
        while release:
            k = release.pop()
            refs[k] -= 1
            trail.append(~k)
            if refs[k] == 0:
                delta[0] -= costs[choice[k]]
                release.extend(kids[choice[k]])
        choice[c] = alt
        return delta[0], trail, fresh

    def undo(trail):
        for k in reversed(trail):
            refs[k if k >= 0 else ~k] += -1 if k >= 0 else 1

    def pays(d, c):
        return d < -1e-12 * max(1.0, abs(costs[choice[c]]))

    def pair(c, delta, fresh):
        tries = 0
        for f in fresh:
            for p in parents[f]:
                d = node_class[p]
                if d == c or refs[d] <= 0 or choice[d] == p or not math.isfinite(costs[p]):
                    continue
                tries += 1
                if tries > MAX_PAIR_TRIES:
                    return False
                old = choice[d]
                try:
                    delta2, trail2, _ = switch(d, p)
                except _Cycle:
                    continue
                if pays(delta + delta2, c):
                    return True
                undo(trail2)
                choice[d] = old
        return False

    for _ in range(max_passes):
        improved = False
        for c in _topological(g, choice, roots):
            if refs[c] <= 0 or len(g.class_nodes[c]) < 2:
                continue
            for alt in g.class_nodes[c]:
                old = choice[c]
                if alt == old or not math.isfinite(costs[alt]) or refs[c] <= 0:
                    continue
                try:
                    delta, trail, fresh = switch(c, alt)
                except _Cycle:
                    continue
                if pays(delta, c) or pair(c, delta, fresh):
                    improved = True
                else:
                    undo(trail)
                    choice[c] = old
        if not improved:
            break
    return [n if refs[c] > 0 else -1 for c, n in enumerate(choice)]


def _both(g):
    start = greedy_dag_choice(g, g.costs, g.roots)
    if any(start[r] < 0 for r in g.roots):
        return None, None
    expected = _reference_improve(g, g.costs, list(start), g.roots)
    got = improve_choice(g, g.costs, list(start), g.roots, time_limit=1e9, work=10**12)
    return expected, got


@st.composite
def egraphs(draw):
    """Random e-graphs whose classes share children (so pair moves and sharing arise), with
    cycles among the alternatives."""
    n = draw(st.integers(3, 24))
    nodes = {}
    for c in range(n):
        for k in range(draw(st.integers(1, 4))):
            kids = draw(st.lists(st.integers(0, n - 1), max_size=3))
            if c == n - 1 and k == 0:
                kids = []  # at least one leaf
            cost = draw(st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0, 8.0]))
            nodes[f"n{c}_{k}"] = {"op": "f", "cost": cost, "eclass": f"C{c}", "children": kids}
    for node in nodes.values():  # children name a node of the drawn class (its first)
        node["children"] = [f"n{k}_0" for k in node["children"]]
    roots = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True))
    return {"nodes": nodes, "root_eclasses": [f"C{r}" for r in roots]}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs())
def test_the_same_moves_as_the_straightforward_search(data):
    expected, got = _both(load_json(data))
    assert got == expected


@pytest.mark.skipif(not DATA.is_dir(), reason=f"no extraction-gym data in {DATA}")
@pytest.mark.parametrize("name", ["vgg", "resnet50_acyclic", "bert_acyclic"])
def test_the_same_moves_on_tensat(name):
    g = load_json(DATA / f"{name}.json")
    expected, got = _both(g)
    assert expected is not None and got == expected
