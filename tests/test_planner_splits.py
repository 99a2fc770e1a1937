"""Where the planner splits long fused expressions (codegen/planning/shared_values.py): at the
size fusion's cost model assumes (ir/inline.py KERNEL_EXPR_OPS), each shared value written once
and loaded by the later kernels. The tanh-chain gradient evaluates each tanh once (it ran its
forward chain in each of 4 kernels: 70 tanh for 30); results against float64 references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.kernels.kernel_spec import KernelSpec
from dlvm_eq.codegen.kernels.reference import evaluate
from dlvm_eq.codegen.kernels.spec import Unary, walk
from dlvm_eq.codegen.planning.plan import KernelStep, RowStep
from dlvm_eq.codegen.planning.shared_values import ops_within
from dlvm_eq.extract import fusion_cost
from dlvm_eq.ir import F64, FunctionBuilder, Module, interpret, tensor
from dlvm_eq.ir.inline import KERNEL_EXPR_OPS
from dlvm_eq.pipeline import compile, plan_function


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _tanh_calls(plan) -> int:
    """tanh nodes over all kernel expressions, each kernel's DAG counted once."""
    n = 0
    for k in plan.kernels:
        spec = k.spec
        roots = list(spec.outputs) if hasattr(spec, "outputs") else [spec.body]
        if isinstance(k, RowStep):
            roots += [r[0] for r in spec.reductions]
        n += sum(1 for e in walk(roots) if isinstance(e, Unary) and e.op == "tanh")
    return n


def _deep(depth):
    def deep(x):
        for _ in range(depth):
            x = dq.tanh(x * x + x)
        return dq.sum(x)

    return deep


def _value(x, depth):
    for _ in range(depth):
        x = np.tanh(x * x + x)
    return x.sum()


def test_one_split_size_for_the_planner_and_fusions_cost_model():
    assert fusion_cost.EXPAND_LIMIT == KERNEL_EXPR_OPS


@pytest.mark.parametrize("depth", [30, 64])
def test_the_tanh_chain_gradient_evaluates_each_tanh_once(depth):
    a = np.linspace(-0.9, 0.7, 6).astype(np.float32)
    f = dq.jit(dq.grad(_deep(depth)))
    got = f(a)
    assert _tanh_calls(f.report(a).plan) == depth  # was 70 for depth 30 (4 kernels)
    x, h = a.astype(np.float64), 1e-6  # float64 central differences
    fd = np.array(
        [(_value(x + h * e, depth) - _value(x - h * e, depth)) / (2 * h) for e in np.eye(6)]
    )
    np.testing.assert_allclose(got, fd, rtol=1e-4, atol=2e-5 * np.abs(fd).max())


def test_the_float64_tanh_chain_gradient_is_the_interpreters():
    a = np.linspace(-0.9, 0.7, 6)
    deep = _deep(30)
    got = dq.jit(dq.grad(deep))(a)
    m = dq.make_ir(dq.grad(deep))(a)
    name = next(iter(m.functions))
    want = interpret(m, name, a, float64=True)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


def test_ops_within_counts_shared_nodes_once_and_stops_past_its_limit():
    from dlvm_eq.codegen.kernels.spec import Load

    x = Load(0)
    for _ in range(50):
        x = x * x + x  # a tree of 2^50 nodes, a DAG of 100 ops
    assert ops_within(x, 1000) == 100
    assert ops_within(x, 10) == 11


def _chain_module(picks: list[tuple[int, int, int]]) -> Module:
    """v_i = tanh(op(v_i-1, v_b)) or sin(v_i-1) over 6 float64s, v_b up to 40 values behind
    (shared values read far apart): a chain of at least len(picks) ops, longer than a kernel
    from KERNEL_EXPR_OPS picks on. The last value and one an eighth of the way are the results
    (the chain after that one is longer than a kernel from 8/7 KERNEL_EXPR_OPS picks on)."""
    b = FunctionBuilder("f", [tensor(6, F64)], ["x"])
    vals = list(b.params)
    for kind, ib, binop in picks:
        a, c = vals[-1], vals[-1 - ib % len(vals)]
        if kind == 0:
            vals.append(b.emit("sin", [a]))
        else:
            y = b.emit(("add", "multiply", "subtract")[binop], [a, c])
            vals.append(b.emit("tanh", [y]))
    m = Module("m")
    m.add(b.finish([vals[-1], vals[len(vals) // 8]]))
    return m


def _run_plan(plan, x: np.ndarray) -> list[np.ndarray]:
    """The plan's kernels evaluated by numpy in float64 (kernels/reference.py), step by step
    through its slots: the planner's splits checked without LLVM."""
    slots = {plan.params[0]: x}
    for step in plan.steps:
        assert isinstance(step, KernelStep) and isinstance(step.spec, KernelSpec), step
        outs = evaluate(step.spec, [slots[i] for i in step.inputs], compute="f64")
        slots.update(zip(step.outputs, outs))
    return [slots[v.slot].reshape(v.shape) for v in plan.results]


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 2)),
        min_size=KERNEL_EXPR_OPS * 8 // 7 + 20,  # a split, by construction
        max_size=KERNEL_EXPR_OPS * 8 // 7 + 200,
    ),
    st.integers(0, 2**31 - 1),
)
def test_random_deep_chains_split_and_agree_with_the_interpreter(picks, seed):
    m = _chain_module(picks)
    x = np.random.default_rng(seed).uniform(-1.0, 1.0, 6)
    plan = plan_function(m["f"], m)
    for k in plan.kernels:  # each output near the split size: grouped siblings at most twice
        for out in k.spec.outputs:
            assert ops_within(out, 4 * KERNEL_EXPR_OPS) <= 2 * KERNEL_EXPR_OPS + 1
    want = interpret(m, "f", x, float64=True)
    for g, w in zip(_run_plan(plan, x), want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(w).max()))


def test_a_deep_random_chain_compiles_to_the_interpreters_values():
    rng = np.random.default_rng(3)
    picks = [tuple(int(v) for v in rng.integers(0, (4, 41, 3))) for _ in range(400)]
    m = _chain_module(picks)
    plan = plan_function(m["f"], m)
    assert len(plan.kernels) > 1  # split: the test exercises shared_values
    x = rng.uniform(-1.0, 1.0, 6)
    got = compile(m, "f", optimize=False)(x)
    for g, w in zip(got, interpret(m, "f", x, float64=True)):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(w).max()))
