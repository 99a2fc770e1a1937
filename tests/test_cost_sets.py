"""Persistent cost sets (extract/cost_sets.py) against plain dicts, and the greedy extractor that
uses them (extract/greedy.py) against its dict-copying version (kept below as the oracle)."""

from __future__ import annotations

import heapq
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlvm_eq.extract import cost_sets, greedy
from dlvm_eq.extract.choice import dag_cost_of, walk
from dlvm_eq.extract.graph import load_json
from dlvm_eq.extract.prune import leaf_worklist, reachable_classes


@pytest.fixture
def tiny_small(monkeypatch):
    """Sets of more than 3 classes become treaps: the tree code runs on small examples (the
    same value for every example: the fixture may be shared by hypothesis's examples)."""
    monkeypatch.setattr(cost_sets, "SMALL", 3)
    monkeypatch.setattr(cost_sets, "FEW", 2)  # sets of 2 or more are merged as treaps
    monkeypatch.setattr(greedy, "SMALL", 3)


entries = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 9).map(float)), max_size=30)
# a program of set operations: ("add", set index, class, cost) or ("merge", [set indices])
ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 99), st.integers(0, 40), st.integers(0, 9)),
        st.tuples(st.just("merge"), st.lists(st.integers(0, 99), min_size=1, max_size=4)),
    ),
    max_size=40,
)


def check_same(s, d: dict) -> None:
    assert cost_sets.items(s) == sorted(d.items())
    assert cost_sets.size(s) == len(d)
    assert cost_sets.total(s) == sum(d.values())  # integer costs: exact in any order
    for k in range(42):
        assert cost_sets.contains(s, k) == (k in d)


@given(program=ops)
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_sets_behave_as_dicts_and_are_never_changed(tiny_small, program):
    sets, dicts = [None], [{}]
    for op in program:
        if op[0] == "add":
            _, i, k, v = op
            i %= len(sets)
            before = dict(dicts[i])
            sets.append(cost_sets.added(sets[i], k, float(v)))
            dicts.append({**dicts[i], k: float(v)})
            check_same(sets[i], before)  # persistent: the operand is as it was
        else:
            idx = [i % len(sets) for i in op[1]]
            want: dict = {}
            for i in idx:
                want.update(dicts[i])  # a later set's cost of a class wins
            sets.append(cost_sets.merged([sets[i] for i in idx]))
            dicts.append(want)
            for i in idx:
                check_same(sets[i], dicts[i])
        check_same(sets[-1], dicts[-1])


@given(parts=st.lists(entries, min_size=1, max_size=4), extra=entries)
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_a_merge_of_sets_is_the_dict_update_of_them(tiny_small, parts, extra):
    sets, dicts = [], []
    for part in parts:
        s, d = None, {}
        for k, v in part:
            s = cost_sets.added(s, k, v)
            d[k] = v
        sets.append(s)
        dicts.append(d)
    # and a set grown from the first: the two share most of their nodes
    grown, d = sets[0], dict(dicts[0])
    for k, v in extra:
        grown = cost_sets.added(grown, k, v)
        d[k] = v
    sets.append(grown)
    dicts.append(d)
    want: dict = {}
    for d in dicts:
        want.update(d)
    check_same(cost_sets.merged(sets), want)
    want = dict(d)  # the growth first, then the rest: the rest's costs win
    for d in dicts[:-1]:
        want.update(d)
    check_same(cost_sets.merged(sets[-1:] + sets[:-1]), want)


def test_a_chain_of_classes_keeps_the_treap_shallow():
    s = None
    for k in range(50_000):
        s = cost_sets.added(s, k, 1.0)
    depth, stack = 0, [(s, 1)]
    while stack:
        t, d = stack.pop()
        if t is not None and type(t) is tuple:
            depth = max(depth, d)
            stack += [(t[cost_sets.LEFT], d + 1), (t[cost_sets.RIGHT], d + 1)]
    assert depth < 4 * math.log2(50_000)  # a treap of random priorities: ~2.5 log2 n
    assert cost_sets.total(s) == 50_000.0


def test_growing_one_set_shares_the_rest():
    big = None
    for k in range(0, 4000, 2):
        big = cost_sets.added(big, k, 1.0)
    grown = cost_sets.added(big, 1001, 2.0)

    def nodes(t):
        out, stack = set(), [t]
        while stack:
            t = stack.pop()
            if t is not None:
                out.add(id(t))
                stack += [t[cost_sets.LEFT], t[cost_sets.RIGHT]]
        return out

    # one root-to-leaf path is new, the rest are the same objects
    assert len(nodes(grown) - nodes(big)) < 4 * math.log2(2000)
    assert cost_sets.merged([big, grown]) is grown  # a union of a set with its growth: walks


# ------------------------------------------------------------------ greedy against its dict version


def dict_greedy_sets(graph, costs, roots):
    """greedy_dag_sets as it was before cost_sets.py (dict copies, no size limit)."""
    node_class, kids_of = graph.node_class, graph.child_sets
    live = reachable_classes(graph, roots)
    best = [math.inf] * graph.num_classes
    sets: list = [None] * graph.num_classes
    choice = [-1] * graph.num_classes
    missing = [len(ks) for ks in kids_of]
    heap, queued = leaf_worklist(graph, costs, live)
    while heap:
        _, n = heapq.heappop(heap)
        queued[n] = 0
        c, kids, own = node_class[n], kids_of[n], costs[n]
        found = None
        if len(kids) == 1:
            k = kids[0]
            if own + best[k] < best[c] and c not in sets[k]:
                found = best[k] + own, {**sets[k], c: own}
        elif kids:
            if own + max(best[k] for k in kids) < best[c]:
                big = max(kids, key=lambda k: len(sets[k]))
                cset = dict(sets[big])
                for k in kids:
                    if k != big:
                        cset.update(sets[k])
                if c not in cset:
                    cset[c] = own
                    total = sum(cset.values())
                    found = (total, cset) if total < best[c] else None
        elif own < best[c]:
            found = own, {c: own}
        if found is None:
            continue
        first = best[c] == math.inf
        best[c], sets[c] = found
        choice[c] = n
        for p in graph.parents[c]:
            if first:
                missing[p] -= 1
            if missing[p] == 0 and not queued[p] and costs[p] < math.inf and live[node_class[p]]:
                queued[p] = 1
                heapq.heappush(heap, (costs[p] + found[0], p))
    return choice, sets


@st.composite
def egraphs(draw):
    """Random e-graphs of up to 30 classes, cycles allowed, small integer costs (ties)."""
    n = draw(st.integers(1, 30))
    nodes = {}
    for c in range(n):
        for i in range(draw(st.integers(1, 3))):
            kids = draw(st.lists(st.integers(0, n - 1), max_size=3))
            nodes[f"n{c}.{i}"] = {
                "op": f"f{i}",
                "children": [f"n{k}.0" for k in kids],
                "eclass": f"C{c}",
                "cost": float(draw(st.integers(0, 6))),
            }
    return {"nodes": nodes, "root_eclasses": [f"C{draw(st.integers(0, n - 1))}"]}


@given(data=egraphs())
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_greedy_chooses_as_its_dict_version(tiny_small, data):
    g = load_json(data)
    want_choice, want_sets = dict_greedy_sets(g, g.costs, g.roots)
    choice, sets = greedy.greedy_dag_sets(g, g.costs, g.roots)
    assert choice == want_choice
    for s, d in zip(sets, want_sets):
        if d is None:
            assert s is None
        else:
            check_same(s, d)


def test_a_shared_chain_deeper_than_old_limits_extracts_at_its_dag_cost():
    # x_{i+1} = x_i * x_i + x_i: as a tree, 3^n; the old greedy's sets stopped being copied past
    # 2,048 classes, counted trees there and overflowed to inf: no term for the root
    n = 3000
    nodes = {"x": {"op": "x", "children": [], "eclass": "C0", "cost": 1.0}}
    for i in range(1, n):
        prev = "x" if i == 1 else f"a{i - 1}"
        nodes[f"m{i}"] = {"op": "mul", "children": [prev, prev], "eclass": f"M{i}", "cost": 1.0}
        nodes[f"a{i}"] = {"op": "add", "children": [f"m{i}", prev], "eclass": f"C{i}", "cost": 1.0}
    g = load_json({"nodes": nodes, "root_eclasses": [f"C{n - 1}"]})
    choice = greedy.greedy_dag_choice(g, g.costs, g.roots)
    assert g.node_ids[choice[g.roots[0]]] == f"a{n - 1}"
    assert dag_cost_of(g.costs, choice, walk(g, choice, g.roots)) == 1 + 2 * (n - 1)
