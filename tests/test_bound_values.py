"""Program values live in the e-graph as rows of one marker function, not as egglog globals
(egraph/values.py): e-graphs, fusion decisions and plans stay what globals gave, at linear cost."""

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlvm_eq.egraph import values
from dlvm_eq.egraph.values import MARKER, BoundValues, drop_markers
from dlvm_eq.errors import DlvmError
from dlvm_eq.ir.parser import parse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_deep_programs import chain_text  # noqa: E402

# ------------------------------------------------------------------ the text translation


def test_lets_become_rows_and_names_their_lookups():
    v = BoundValues()
    text = v.bind_lines(
        [
            '(let $a_ (Var "x"))',
            "(set (shape $a_) (vec-of 4))",
            '(let $b_ (Add $a_ (Const 1.0 "f32")))',
        ]
    )
    assert text == (
        f'(set ({MARKER} 0) (Var "x"))\n(set (shape ({MARKER} 0)) (vec-of 4))\n'
        f'(set ({MARKER} 1) (Add ({MARKER} 0) (Const 1.0 "f32")))\n'
    )
    assert v.row("$b_") == 1 and v.row("$c_") is None


def test_strings_and_names_we_did_not_bind_are_left_alone():
    v = BoundValues()
    v.bind_lines(['(let $a_ (Var "x"))'])
    assert (
        v.refer('(Var "$a_") $t (Tanh $a_) "\\"$a_"')
        == f'(Var "$a_") $t (Tanh ({MARKER} 0)) "\\"$a_"'
    )


def test_pop_forgets_what_was_bound_since_push_and_a_name_is_bound_once():
    v = BoundValues()
    v.bind_lines(['(let $a_ (Var "x"))'])
    v.push()
    v.bind_lines(['(let $b_ (Var "y"))'])
    v.pop()
    assert v.row("$b_") is None and v.row("$a_") == 0
    v.bind_lines(['(let $b_ (Var "y"))'])  # as egglog allows after its pop
    with pytest.raises(DlvmError, match="bound twice"):
        v.bind_lines(['(let $a_ (Var "z"))'])


def test_serialized_rows_are_dropped_and_children_point_at_the_term():
    def node(op, kids, cls):
        return {"op": op, "children": kids, "eclass": cls, "cost": 1.0, "subsumed": False}

    data = {
        "nodes": {
            "primitive-i64-0": node("0", [], "i64-0"),
            "primitive-i64-3": node("3", [], "i64-3"),
            "function-0-Var": node("Var", [], "T-0"),
            "function-0-row": node(MARKER, ["primitive-i64-0"], "T-0"),
            "function-1-row": node(MARKER, ["primitive-i64-3"], "T-9"),  # its class was cut
            "function-0-Tanh": node("Tanh", ["function-0-row"], "T-1"),
            "function-0-Reduce": node("Reduce", ["function-0-Var", "primitive-i64-3"], "T-2"),
        },
        "root_eclasses": ["T-1"],
        "class_data": {
            c: {"type": "i64" if c.startswith("i64") else "Term"}
            for c in ("i64-0", "i64-3", "T-0", "T-1", "T-2", "T-9")
        },
    }
    drop_markers(data)
    nodes = data["nodes"]
    assert "function-0-row" not in nodes and nodes["function-0-Tanh"]["children"] == [
        "function-0-Var"
    ]
    assert "primitive-i64-0" not in nodes and "i64-0" not in data["class_data"]
    assert "primitive-i64-3" in nodes  # the Reduce's axis and the lone row use it
    assert nodes["function-1-row"]["cost"] == math.inf


# ------------------------------------------------------------------ the e-graph


def test_a_loaded_function_binds_no_global_per_value():
    from dlvm_eq.egraph.session import EGraphSession

    m = parse(chain_text(30), "chain.dl")
    s = EGraphSession()
    prog = s.add_function(m["chain"], m)
    s.run_analysis()
    g = s.serialize(prog.roots)
    # egglog names the e-class of every global in class_data ("let"): none is left
    assert not [c for c, d in g.class_data.items() if "let" in d]
    assert not [n for n, d in g.nodes.items() if d["op"] == MARKER]
    assert len(g.roots) == 1 and g.term_nodes(g.roots[0])
    shapes = [n for n, d in g.nodes.items() if d["op"] == "shape"]
    assert len(shapes) >= 30  # the analysis ran through the rows


def test_the_fusion_decision_is_the_one_globals_gave(monkeypatch):
    from dlvm_eq.egraph.fusion_decision import decide_fusion
    from dlvm_eq.egraph.ruleset_schedule import Budget
    from dlvm_eq.ir.inline import flatten

    m = parse(chain_text(600), "chain.dl")
    flat = flatten(m["chain"], m)
    budget = Budget(iterations=12, nodes=200_000, seconds=600)  # no stop on a busy machine
    rows = decide_fusion(flat, budget=budget)
    monkeypatch.setattr(values, "BIND_AS_ROWS", False)
    globs = decide_fusion(flat, budget=budget)
    assert rows.materialize == globs.materialize and rows.same_as.keys() == globs.same_as.keys()
    for f in (
        "nodes",
        "classes",
        "stop_reason",
        "values",
        "forced",
        "materialized",
        "inlined",
        "cost",
        "cost_unfused",
    ):
        assert getattr(rows.report, f) == getattr(globs.report, f), f


MLP_CHILD = """
import sys
import numpy as np
import dlvm_eq.egraph.values as V
V.BIND_AS_ROWS = sys.argv[1] == "rows"
import dlvm_eq as dq
from dlvm_eq.models import mlp
params = mlp.init_params([784, 256, 10], seed=0)
x = np.random.default_rng(1).standard_normal((256, 784)).astype(np.float32)
onehot = np.eye(10, dtype=np.float32)[np.arange(256) % 10]
vg = dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3))
def step(w1, b1, w2, b2, x, onehot):
    loss, grads = vg(w1, b1, w2, b2, x, onehot)
    return (loss, *grads)
c = dq.compile(dq.make_ir(step)(*params, x, onehot), "step", "cpu")
print(c.plan)
print(c.report)
"""


def test_the_mlp_step_compiles_to_the_plan_globals_gave(tmp_path):
    """Gradient (adjoint lets, deletes), optimizer and fusion on the MLP training step, each
    in a fresh process and cache: the same plan and report as with egglog globals."""
    import os

    out = {}
    for mode in ("rows", "globals"):
        env = dict(
            os.environ,
            DLVM_EQ_CACHE_DIR=str(tmp_path / mode),
            PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        r = subprocess.run(
            [sys.executable, "-c", MLP_CHILD, mode],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=ROOT,
        )
        assert r.returncode == 0, r.stderr
        # times differ from run to run; everything else must not
        out[mode] = [
            re.sub(r"\d+(\.\d+)? ms", "_ ms", line)
            for line in r.stdout.splitlines()
            if not line.strip().startswith("time:")
        ]
    assert "kernels:" in "\n".join(out["rows"])
    assert out["rows"] == out["globals"]


def test_a_three_thousand_instruction_chain_compiles_and_agrees():
    import dlvm_eq as dq

    m = parse(chain_text(3000), "chain.dl")
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2))
    got = dq.compile(m, "chain", "cpu")(x, y)
    np.testing.assert_allclose(got, dq.interpret(m, "chain", x, y), rtol=1e-4, atol=1e-5)
