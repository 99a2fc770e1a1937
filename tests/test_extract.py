"""Extraction: hand-built e-graphs with known optima, brute force on random small e-graphs,
validity and known costs on Tensat's e-graphs, and an e-graph that egglog built itself."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlvm_eq.extract import ExtractionError, dag_cost, extract, load_json, tree_cost, validate
from dlvm_eq.extract.greedy import greedy_dag_choice

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "extraction-gym"
TENSAT = sorted(DATA.glob("*.json"))


def egraph(classes: dict[str, list[tuple]], roots=("R",)) -> dict:
    """{class: [(node_id, cost, [child node ids]), ...]} -> the serialized JSON dict."""
    nodes = {
        nid: {"op": nid, "cost": cost, "eclass": c, "children": list(kids)}
        for c, ns in classes.items()
        for nid, cost, kids in ns
    }
    return {"nodes": nodes, "root_eclasses": list(roots)}


# r1 needs x twice (through a and b): tree cost 11 but DAG cost 7; r2 costs 10 either way.
SHARED = egraph(
    {
        "X": [("x", 4.0, [])],
        "A": [("a", 1.0, ["x"])],
        "B": [("b", 1.0, ["x"])],
        "R": [("r1", 1.0, ["a", "b"]), ("r2", 10.0, [])],
    }
)


def test_dag_extractors_pay_a_shared_subterm_once():
    tree, greedy, ilp = (extract(SHARED, method=m) for m in ("tree", "greedy", "ilp"))
    assert tree.choice == {"R": "r2"} and tree.dag_cost == 10.0
    assert greedy.choice["R"] == "r1" and greedy.dag_cost == 7.0 and greedy.tree_cost == 11.0
    assert ilp.choice == greedy.choice and ilp.optimal and not ilp.fallback


def test_sharing_across_siblings_greedy_misses_and_the_local_search_finds():
    # Alone, A and B each prefer their leaf (2 < 3); together, sharing s costs 3 + 0 + 0.
    g = load_json(
        egraph(
            {
                "S": [("s", 3.0, [])],
                "A": [("a1", 2.0, []), ("a2", 0.0, ["s"])],
                "B": [("b1", 2.0, []), ("b2", 0.0, ["s"])],
                "R": [("h", 1.0, ["a1", "b1"])],
            }
        )
    )
    alone = greedy_dag_choice(g, g.costs, g.roots)
    assert [g.node_ids[alone[g.class_index[c]]] for c in "AB"] == ["a1", "b1"]  # 5.0
    greedy, ilp = extract(g), extract(g, method="ilp")
    assert greedy.dag_cost == ilp.dag_cost == 4.0
    assert greedy.choice == ilp.choice == {"R": "h", "A": "a2", "B": "b2", "S": "s"}


def test_local_search_never_worsens_and_stays_valid():
    from dlvm_eq.extract.improve import improve_choice

    g = load_json(
        egraph(
            {
                "X": [("x", 4.0, []), ("x2", 1.0, ["r"])],  # x2 would close a cycle through R
                "A": [("a", 1.0, ["x"]), ("a2", 9.0, [])],
                "R": [("r", 1.0, ["a", "x"])],
            }
        )
    )
    choice = greedy_dag_choice(g, g.costs, g.roots)
    improved = improve_choice(g, g.costs, list(choice), g.roots)
    result = {g.class_ids[c]: g.node_ids[n] for c, n in enumerate(improved) if n >= 0}
    validate(g, result)
    assert dag_cost(g, result) == 6.0


def test_tree_cost_counts_each_use_and_dag_cost_each_node():
    g = load_json(egraph({"X": [("x", 1.0, [])], "R": [("f", 2.0, ["x", "x"])]}))
    assert dag_cost(g, {"R": "f", "X": "x"}) == 3.0
    assert tree_cost(g, {"R": "f", "X": "x"}) == 4.0
    assert extract(g).term() == "(f x x)"


def test_validate_names_the_problem():
    g = load_json(
        egraph(
            {
                "X": [("x", 1.0, []), ("x2", 0.0, ["r"])],
                "R": [("r", 1.0, ["x"])],
            }
        )
    )
    validate(g, {"R": "r", "X": "x"})
    with pytest.raises(ExtractionError, match="'X' is reachable .* no chosen"):
        validate(g, {"R": "r"})
    with pytest.raises(ExtractionError, match="cycle: R \\(r\\) -> X \\(x2\\) -> R"):
        validate(g, {"R": "r", "X": "x2"})
    with pytest.raises(ExtractionError, match="of another e-class 'R'"):
        validate(g, {"R": "r", "X": "r"})
    with pytest.raises(ExtractionError, match="unknown .* e-node 'nope'"):
        validate(g, {"R": "nope"})
    # The extractors never pick the cycle (x2 is free, but only through r itself).
    for m in ("tree", "greedy", "ilp"):
        assert extract(g, method=m).choice == {"R": "r", "X": "x"}


def test_stale_cycles_are_repaired_with_the_safe_choice():
    from dlvm_eq.extract.choice import break_cycles, walk

    g = load_json(
        egraph(
            {
                "A": [("a_leaf", 5.0, []), ("a_b", 0.0, ["b_a"])],
                "B": [("b_leaf", 5.0, []), ("b_a", 0.0, ["a_b"])],
                "R": [("r", 1.0, ["a_b", "b_a"])],
            }
        )
    )
    ix = g.node_index
    cyclic = [ix["a_b"], ix["b_a"], ix["r"]]  # A -> B -> A
    safe = [ix["a_leaf"], ix["b_leaf"], ix["r"]]
    assert break_cycles(g, cyclic, safe, g.roots) == 2
    assert [g.node_ids[n] for n in cyclic] == ["a_leaf", "b_leaf", "r"]
    assert walk(g, cyclic, g.roots)
    # The optimum breaks the free mutual recursion once: B reuses A's leaf (or A B's); greedy
    # sees a tie per class (5 either way) and keeps both leaves; its local search finds the rest.
    assert extract(g, method="ilp").dag_cost == 6.0
    assert dag_cost(g, {"A": "a_leaf", "B": "b_leaf", "R": "r"}) == 11.0
    assert extract(g).dag_cost == 6.0


def test_loader_tolerates_egglog_details(tmp_path):
    data = {
        "nodes": {
            "primitive-i64-2": {
                "op": "2",
                "children": [],
                "eclass": "i64-2",
                "cost": 1.0,
                "subsumed": False,
            },
            "function-0-Num": {
                "op": "Num",
                "children": ["primitive-i64-2"],
                "eclass": "M-1",
                "cost": 1.0,
            },
            "function-0-Neg": {
                "op": "Neg",
                "children": ["M-1"],
                "eclass": "M-2",
                "cost": 1.0,
            },  # child as class
            "function-1-Neg": {
                "op": "Cheap",
                "children": [],
                "eclass": "M-2",
                "cost": 0.0,
                "subsumed": True,
            },
        },
        "root_eclasses": ["M-2"],
    }
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    for source in (data, json.dumps(data), path, str(path)):
        g = load_json(source)
        assert g.num_nodes == 3 and g.class_data == {}
        assert g.classes["M-2"] == ("function-0-Neg",)  # the subsumed node is gone
        assert g.node_children["function-0-Neg"] == ("M-1",)
        r = extract(g)
        assert r.term() == "(Neg (Num 2))" and r.dag_cost == 3.0


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"nodes": {"a": {"op": "a", "children": ["zz"], "eclass": "A", "cost": 1}}}, "child 'zz'"),
        (
            {
                "nodes": {"a": {"op": "a", "children": [], "eclass": "A", "cost": 1}},
                "root_eclasses": ["B"],
            },
            "root e-class 'B'",
        ),
        ({"nodes": {"a": {"op": "a", "children": [], "cost": 1}}}, "no 'eclass'"),
        ("{not json", "not JSON"),
    ],
)
def test_loader_errors(bad, message):
    with pytest.raises(ExtractionError, match=message):
        load_json(bad)


def test_roots_and_costs_are_checked():
    g = load_json(SHARED)
    with pytest.raises(ExtractionError, match="unknown e-class 'Q'"):
        extract(g, roots=["Q"])
    with pytest.raises(ExtractionError, match="unknown extraction method"):
        extract(g, method="best")
    with pytest.raises(ExtractionError, match="must be >= 0"):
        extract(g, cost=lambda graph, nid: -1.0)
    with pytest.raises(ExtractionError, match="no root"):
        extract(load_json(dict(SHARED, root_eclasses=[])))
    assert extract(g, roots="A").choice == {"A": "a", "X": "x"}


def test_cost_models_are_pluggable():
    class Flat:  # a CostModel: every node costs 1, so r2 (one node) beats r1 (four)
        def node_cost(self, graph, node_id):
            return 1.0

    g = load_json(SHARED)
    assert extract(g, cost=Flat()).choice == {"R": "r2"}
    # A callable; infinity forbids a node.
    forbid = lambda graph, nid: math.inf if nid == "r1" else graph.costs[graph.node_index[nid]]
    assert extract(g, cost=forbid, method="ilp").choice == {"R": "r2"}
    only_r1 = lambda graph, nid: math.inf if nid == "r2" else 1.0
    assert extract(g, cost=only_r1, method="greedy").dag_cost == 4.0
    with pytest.raises(ExtractionError, match="no finite, acyclic term"):
        extract(g, cost=lambda graph, nid: math.inf)


# ---- random small e-graphs against brute force ---------------------------------------------


@st.composite
def small_egraphs(draw, acyclic: bool):
    n = draw(st.integers(1, 6))
    classes = {}
    for c in range(n):
        pool = list(range(c)) if acyclic else list(range(n))
        nodes = []
        for i in range(draw(st.integers(1, 3))):
            kids = draw(st.lists(st.sampled_from(pool), max_size=2)) if pool else []
            nodes.append((f"{c}.{i}", float(draw(st.integers(0, 5))), [f"{k}.0" for k in kids]))
        classes[f"C{c}"] = nodes
    root = draw(st.integers(0, n - 1))
    return egraph(classes, roots=[f"C{root}"])


def brute_force(data: dict) -> float:
    """Minimum DAG cost over every assignment of one node per class (inf if none is valid);
    written independently of the package."""
    nodes = data["nodes"]
    by_class: dict[str, list[str]] = {}
    for nid, node in nodes.items():
        by_class.setdefault(node["eclass"], []).append(nid)
    names = list(by_class)
    best = math.inf
    for pick in itertools.product(*(by_class[c] for c in names)):
        choice = dict(zip(names, pick))
        used: set[str] = set()

        def visit(c, path) -> bool:
            if c in path:
                return False
            if c in used:
                return True
            ok = all(visit(nodes[k]["eclass"], path | {c}) for k in nodes[choice[c]]["children"])
            used.add(c)
            return ok

        if all(visit(r, frozenset()) for r in data["root_eclasses"]):
            best = min(best, sum(nodes[choice[c]]["cost"] for c in used))
    return best


def check_against_brute_force(data: dict) -> None:
    optimum = brute_force(data)
    g = load_json(data)
    if optimum == math.inf:
        for m in ("tree", "greedy", "ilp"):
            with pytest.raises(ExtractionError):
                extract(g, method=m)
        return
    ilp = extract(g, method="ilp", time_limit=20.0)
    assert ilp.optimal and not ilp.fallback
    assert ilp.dag_cost == optimum
    for m in ("tree", "greedy"):
        r = extract(g, method=m)
        validate(g, r.choice)
        assert r.dag_cost >= optimum
        assert dag_cost(g, r.choice) == r.dag_cost


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_egraphs(acyclic=True))
def test_ilp_equals_brute_force_acyclic(data):
    check_against_brute_force(data)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_egraphs(acyclic=False))
def test_ilp_equals_brute_force_cyclic(data):
    check_against_brute_force(data)


# ---- Tensat's e-graphs (extraction-gym) -----------------------------------------------------

needs_data = pytest.mark.skipif(not TENSAT, reason=f"no extraction-gym data in {DATA}")


@pytest.fixture(scope="module")
def tensat():
    return {p.stem: load_json(p) for p in TENSAT}


def assert_valid(g, r):
    """One node of its own class per reachable class, acyclic: checked independently here."""
    assert set(r.choice) == set(_reachable(g, r.choice))
    for cid, nid in r.choice.items():
        assert g.node_eclass[nid] == cid
    validate(g, r.choice)


def _reachable(g, choice):
    seen, todo = set(), list(g.root_eclasses)
    while todo:
        c = todo.pop()
        if c not in seen:
            seen.add(c)
            todo.extend(g.node_children[choice[c]])
    return seen


@needs_data
@pytest.mark.parametrize("name", [p.stem for p in TENSAT])
def test_every_extractor_is_valid_on_tensat(tensat, name):
    g = tensat[name]
    results = {m: extract(g, method=m, time_limit=2.0) for m in ("tree", "greedy", "ilp")}
    for r in results.values():
        assert_valid(g, r)
    greedy, ilp = results["greedy"], results["ilp"]
    assert ilp.dag_cost <= greedy.dag_cost  # never worse: greedy is its fallback
    assert greedy.dag_cost <= results["tree"].dag_cost * (1 + 1e-12)
    if ilp.optimal:
        assert greedy.dag_cost <= ilp.dag_cost * 1.02
    elif ilp.fallback:  # no proven optimum in 2 s: greedy's answer, and the status says so
        assert ilp.choice == greedy.choice and "greedy result" in ilp.status
    # pure Python, about 0.1 s on bert here: a hang guard only (a loaded core took seconds);
    # the ILP's 2 s limit decides only which of the branches above holds, each asserted
    assert greedy.seconds < 60.0


@needs_data
def test_known_tensat_costs(tensat):
    # Greedy alone against the data set README's values (measured with independent extractors).
    def greedy_alone(g):
        from dlvm_eq.extract.choice import dag_cost_of, walk

        choice = greedy_dag_choice(g, g.costs, g.roots)
        return dag_cost_of(g.costs, choice, walk(g, choice, g.roots))

    assert greedy_alone(tensat["vgg_acyclic"]) == pytest.approx(4.866775, abs=1e-6)
    assert greedy_alone(tensat["resnet50_acyclic"]) == pytest.approx(4.425745, abs=1e-6)
    assert greedy_alone(tensat["bert"]) == pytest.approx(0.824704, abs=1e-6)
    assert greedy_alone(tensat["vgg"]) == pytest.approx(4.850757, abs=1e-6)
    # The default extractor (greedy + local search) reaches the proven optimum of
    # resnet50_acyclic, and on bert beats what HiGHS finds in 60 s (0.780955).
    ilp = extract(tensat["resnet50_acyclic"], method="ilp", time_limit=20.0)
    assert ilp.optimal and ilp.dag_cost == pytest.approx(4.415993, abs=1e-6)
    assert extract(tensat["resnet50_acyclic"]).dag_cost == pytest.approx(4.415993, abs=1e-6)
    assert extract(tensat["bert"]).dag_cost < 0.78


# ---- an e-graph built by egglog itself ------------------------------------------------------

EGG = """
(datatype Math (Num i64) (Var String) (Add Math Math) (Mul Math Math))
(let $e (Add (Mul (Var "a") (Var "c")) (Mul (Var "b") (Var "c"))))
(rewrite (Add (Mul a c) (Mul b c)) (Mul (Add a b) c))
(rewrite (Add a b) (Add b a))
(rewrite (Mul a b) (Mul b a))
(rewrite (Mul a (Num 1)) a)
(run 4)
"""


def _egglog(program: str):
    bindings = pytest.importorskip("egglog.bindings")
    eg = bindings.EGraph()
    eg.run_program(*eg.parse_program(program, filename="test.egg"))
    return bindings, eg


@pytest.mark.parametrize("subsume", [False, True])
def test_egglog_serialized_egraph_extracts_to_an_equal_term(subsume):
    program = EGG.replace("(Mul (Add a b) c))", "(Mul (Add a b) c) :subsume)") if subsume else EGG
    bindings, eg = _egglog(program)
    root = bindings.Var(bindings.PanicSpan(), "$e")
    g = load_json(eg.serialize([root]).to_json())
    assert len(g.roots) == 1
    egglog_cost = eg.run_program(*eg.parse_program("(extract $e)", filename="q.egg"))[-1].cost
    for m in ("tree", "greedy", "ilp"):
        r = extract(g, method=m)
        assert_valid(g, r)
        assert not any(g.raw_nodes[n].get("subsumed") for n in r.choice.values())
        term = r.term()
        # egglog agrees the term equals $e (a wrong term fails this check).
        eg.run_program(*eg.parse_program(f"(check (= $e {term}))", filename="check.egg"))
        # Factored: Mul, Add, three Var, three strings; egglog's own extractor agrees.
        assert r.dag_cost == 8.0 and r.tree_cost == egglog_cost == 8
        assert term.count("(Mul ") == 1 and term.count("(Add ") == 1
