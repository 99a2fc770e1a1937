"""Deep programs compile, and agree with the interpreter: no recursion limit anywhere in compile,
and shared sub-expressions are built once (interned kernel expressions)."""

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen.kernels.kernel_spec import KernelInput, KernelSpec, ReduceSpec
from dlvm_eq.codegen.kernels.spec import Binary, Const, Load, Unary, dtype_of, resolve, walk
from dlvm_eq.ir.parser import parse

ROOT = Path(__file__).resolve().parent.parent
# The chain the benchmark times (benchmarks/deep_programs.py) is the chain tested here.
sys.path.insert(0, str(ROOT / "benchmarks"))
from deep_programs import chain_text  # noqa: E402

# ------------------------------------------------------------------ interning (pattern level)


def test_building_a_node_twice_returns_the_same_object():
    x = Load(0)
    assert Load(0) is x
    assert (x * 2 + 1) is (Load(0) * 2 + 1)
    assert Unary("tanh", x) is Unary("tanh", Load(0))
    assert Binary("add", x, Const(1.0)) is not Binary("add", Load(1), Const(1.0))


def test_constants_that_python_calls_equal_stay_distinct():
    # 1 == 1.0 == True and 0.0 == -0.0 in Python; as kernel constants they differ
    assert Const(1) is not Const(1.0)
    assert Const(1) is not Const(True)
    assert Const(0.0) is not Const(-0.0)
    assert Const(1.0, "f32") is Const(1.0, dtype="f32")
    assert Const(1.0, "f32") is not Const(1.0, "f64")


def test_pickle_and_copy_keep_identity():
    import copy

    e = Unary("exp", Load(0) * 1.5 + Load(1))
    assert pickle.loads(pickle.dumps(e)) is e
    assert copy.deepcopy(e) is e and copy.copy(e) is e


def test_shared_dag_walks_and_resolves_linearly():
    # x_{k+1} = x_k * x_k + x_k: 60 levels are 2^60 tree nodes, 3 DAG nodes per level
    x = Load(0)
    for _ in range(60):
        x = Unary("tanh", x * x + x)
    assert len(walk([x])) == 1 + 3 * 60  # the Load, and per level: mul, add, tanh
    spec = KernelSpec("deep", (4,), [KernelInput("f32")], [x])
    assert len(walk(spec.outputs)) == len(walk([x]))
    assert spec.output_dtypes == ("f32",)
    assert len(repr(x)) < 3000  # printed as a tree, cut off: not 2^60 characters


def test_a_very_deep_expression_resolves_without_recursion():
    x = Load(0)
    for i in range(20_000):
        x = x * 0.5 + Load(1) if i % 2 else Unary("neg", x)
    out = resolve(x, ("f64", "f64"))
    assert dtype_of(out, ("f64", "f64")) == "f64"
    assert out.b is Load(1) and out.a.b is Const(0.5, "f64")
    spec = ReduceSpec(
        "deep_sum", (3,), [KernelInput("f32"), KernelInput("f32")], x, "add", axes=(0,)
    )
    assert spec.dtype == "f32"


def test_an_ill_typed_deep_expression_is_a_kernel_error():
    x = Load(0)
    for _ in range(5000):
        x = x + 1.0
    bad = Binary("add", x, Load(1))
    with pytest.raises(dq.DlvmError, match="different dtypes f32 and i32"):
        KernelSpec("bad", (2,), [KernelInput("f32"), KernelInput("i32")], [bad])


# ------------------------------------------------------------------ deep programs end to end


def _tanh_chain(n):
    def deep(x):
        for _ in range(n):
            x = dq.tanh(x * x + x)
        return dq.sum(x)

    return deep


@pytest.mark.parametrize("n", [30, 200])
def test_tanh_chain_gradient_compiles_and_agrees_with_the_interpreter(n):
    x = np.array(
        [-4e-3, -2e-3, -1e-3, 0.0, 5e-4, 1e-3], np.float32
    )  # gradients 0.1..2 at depth 200
    want = dq.jit(dq.grad(_tanh_chain(n)), target="interp")(x)
    got = dq.jit(dq.grad(_tanh_chain(n)))(x)
    assert np.all(np.isfinite(want)) and np.abs(want).min() > 0.05
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)


def test_a_two_thousand_layer_tanh_chain_gradient_compiles_and_agrees():
    # 12,000 IR values in the adjoint's e-graph: extraction with exact DAG costs (greedy's
    # tree-cost sets overflowed to inf here: "no finite, acyclic term"), a plan of ~40 kernels
    x = np.array([-4e-4, -2e-4, -1e-4, 0.0, 5e-5, 1e-4], np.float32)  # x + x^2 stays small
    want = dq.jit(dq.grad(_tanh_chain(2000)), target="interp")(x)
    got = dq.jit(dq.grad(_tanh_chain(2000)))(x)
    assert np.all(np.isfinite(want)) and np.abs(want).min() > 0.05
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6)


def test_two_hundred_affine_steps_compile():
    def f(x, y):
        for _ in range(200):
            x = x * 0.999 + y
        return x

    x = np.linspace(-1, 1, 6).astype(np.float32)
    y = np.full(6, 0.01, np.float32)
    want = dq.jit(f, target="interp")(x, y)
    np.testing.assert_allclose(dq.jit(f)(x, y), want, rtol=1e-4)


def test_ten_thousand_instruction_chain_compiles_and_agrees():
    m = parse(chain_text(10_000), "chain.dl")
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2))
    want = dq.interpret(m, "chain", x, y)
    np.testing.assert_allclose(dq.compile(m, "chain", "cpu")(x, y), want, rtol=1e-4, atol=1e-5)


def test_thousand_instruction_chain_through_the_cli(tmp_path):
    src = tmp_path / "chain.dl"
    src.write_text(chain_text(1000))
    rng = np.random.default_rng(1)
    np.savez(
        tmp_path / "in.npz",
        x=rng.standard_normal((4, 8)).astype(np.float32),
        y=rng.standard_normal((4, 8)).astype(np.float32),
    )
    outs = {}
    for target in ("cpu", "interp"):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "dlvm_eq.cli",
                "run",
                str(src),
                "-f",
                "chain",
                "--inputs",
                str(tmp_path / "in.npz"),
                "--target",
                target,
                "-o",
                str(tmp_path / f"{target}.npz"),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
        outs[target] = np.load(tmp_path / f"{target}.npz")["out"]
    np.testing.assert_allclose(outs["cpu"], outs["interp"], rtol=1e-4, atol=1e-5)


def test_optimizing_a_deep_chain_needs_no_recursion_headroom(monkeypatch):
    # the unloader emits iteratively: compile never touches the recursion limit
    m = parse(chain_text(3000), "chain.dl")

    def refuse(limit):
        raise AssertionError(f"compile set the recursion limit to {limit}")

    monkeypatch.setattr(sys, "setrecursionlimit", refuse)
    out = dq.optimize(m).module
    rng = np.random.default_rng(2)
    x, y = (rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2))
    np.testing.assert_allclose(
        dq.interpret(out, "chain", x, y), dq.interpret(m, "chain", x, y), rtol=1e-4, atol=1e-5
    )


def test_a_deep_kernel_expression_compiles_and_runs():
    # spec_text (the object-code cache key) and lowering walk the DAG without recursion
    from dlvm_eq.codegen.kernels.spec_text import spec_text
    from dlvm_eq.codegen.runtime.cpu_kernel import compile_cpu

    x, want = Load(0), np.linspace(-1, 1, 16).astype(np.float32)
    acc = want.astype(np.float64)
    for i in range(1500):
        x = x * 0.999 + 0.001 if i % 2 else x - 0.0005
        acc = acc * 0.999 + 0.001 if i % 2 else acc - 0.0005
    spec = KernelSpec("deep", (16,), [KernelInput("f32")], [x])
    assert spec_text(spec) == spec_text(KernelSpec("deep", (16,), [KernelInput("f32")], [x]))
    np.testing.assert_allclose(compile_cpu(spec)(want), acc, rtol=1e-4, atol=1e-5)


def test_greedy_extraction_of_a_chain_far_deeper_than_a_small_cost_set():
    # cost sets past cost_sets.SMALL classes are treaps sharing their nodes: the choice stays
    # valid and, on a chain (no sharing), optimal
    from dlvm_eq.extract.cost_sets import SMALL
    from dlvm_eq.extract.graph import load_json
    from dlvm_eq.extract.greedy import greedy_dag_choice

    n = 10 * SMALL + 500
    nodes = {"x": {"op": "x", "children": [], "eclass": "C0", "cost": 1.0}}
    for i in range(1, n):
        kid = "x" if i == 1 else f"a{i - 1}"
        nodes[f"a{i}"] = {"op": "f", "children": [kid, "k"], "eclass": f"C{i}", "cost": 1.0}
        nodes[f"b{i}"] = {"op": "g", "children": [kid], "eclass": f"C{i}", "cost": 3.0}
    nodes["k"] = {"op": "k", "children": [], "eclass": "K", "cost": 0.0}
    g = load_json({"nodes": nodes, "root_eclasses": [f"C{n - 1}"]})
    choice = greedy_dag_choice(g, g.costs, g.roots)
    picked = [g.node_ids[choice[g.class_index[f"C{i}"]]] for i in range(1, n)]
    assert picked == [f"a{i}" for i in range(1, n)]
