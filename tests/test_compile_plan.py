"""The kernel plan: what is fused, what is a view, what is a BLAS call, and how temporaries
share memory. Each test checks the plan's structure and that running it gives the
interpreter's answer."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq import config
from dlvm_eq.codegen import KernelSpec, set_cache_dir
from dlvm_eq.codegen.planning.plan import (
    TEMP,
    ConcatStep,
    CopyStep,
    KernelStep,
    MapReduceStep,
    RowStep,
)
from dlvm_eq.ir import interpret
from dlvm_eq.pipeline import compile, plan_function


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _ir(fn, *args):
    return dq.make_ir(fn)(*args)


def _check(module, *args, rtol=2e-6, **kw):
    name = next(iter(module.functions))
    got = compile(module, name, optimize=False, **kw)(*args)
    want = interpret(module, name, *args, float64=True)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(
            g, w, rtol=rtol, atol=rtol * max(1.0, float(np.abs(w).max(initial=0)))
        )


def _plan(module, rows=True):
    name = next(iter(module.functions))
    return plan_function(module[name], module, rows=rows)


RNG = np.random.default_rng(0)
X = RNG.standard_normal((64, 48)).astype(np.float32)


def test_elementwise_chain_is_one_kernel_reading_only_its_input():
    m = _ir(lambda x: dq.sigmoid(x * 1.5 + 0.25) * x, X)
    plan = _plan(m)
    assert len(plan.steps) == 1 and isinstance(plan.steps[0], KernelStep)
    (k,) = plan.kernels
    assert k.inputs == tuple(plan.params) and plan.arena_bytes == 0
    assert {"multiply", "add", "sigmoid"} <= set(k.name.split("_"))
    _check(m, X)


def test_row_softmax_is_one_row_kernel_and_three_kernels_without_rows(monkeypatch):
    m = _ir(lambda x: dq.softmax(x, axis=1), X)
    plan = _plan(m)
    assert [type(s) for s in plan.steps] == [RowStep]
    assert [op for _, op, _ in plan.steps[0].spec.reductions] == ["max", "add"]
    # without rows, the sum is folded in the pass that writes exp(x - max) (multi-output)
    three = _plan(m, rows=False)
    assert [type(s) for s in three.steps] == [KernelStep, MapReduceStep, KernelStep]
    assert [op for _, op, _ in three.steps[1].spec.reductions] == ["add"]
    monkeypatch.setenv("DLVM_EQ_MULTI_OUTPUT", "0")
    config.reload()  # (conftest re-reads the restored environment after the test)
    three = _plan(m, rows=False)
    assert [type(s) for s in three.steps] == [KernelStep] * 3
    assert [isinstance(s.spec, KernelSpec) for s in three.steps] == [False, False, True]
    _check(m, X)


def test_softmax_along_a_leading_axis_is_not_a_row_kernel():
    m = _ir(lambda x: dq.softmax(x, axis=0), X)
    plan = _plan(m)
    assert not any(isinstance(s, RowStep) for s in plan.steps)
    _check(m, X)


def test_transposed_matmul_operands_are_blas_views_not_copies():
    w = RNG.standard_normal((32, 48)).astype(np.float32)
    g = RNG.standard_normal((64, 32)).astype(np.float32)
    m = _ir(lambda x, w, g: (dq.matmul(dq.transpose(x), g), dq.matmul(g, w)), X, w, g)
    plan = _plan(m)
    blas = plan.blas_calls
    assert len(blas) == 2 and not plan.kernels
    assert not any(isinstance(s, CopyStep) for s in plan.steps)
    assert blas[0].a.chain == (("transpose", (1, 0)),) and blas[0].a.slot == plan.params[0]
    assert ".T @" in str(plan)
    _check(m, X, w, g, rtol=1e-5)


def test_mlp_gradient_plan_has_five_blas_calls_and_no_copies():
    from dlvm_eq.models import mlp

    params = mlp.init_params([20, 16, 5])
    x = RNG.standard_normal((8, 20)).astype(np.float32)
    y = np.eye(5, dtype=np.float32)[RNG.integers(0, 5, 8)]
    m = dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3)).lower(*params, x, y)
    plan = _plan(m)
    assert len(plan.blas_calls) == 5
    assert sum(1 for b in plan.blas_calls for v in (b.a, b.b) if v.chain) == 3  # x.T, h.T, w2.T
    assert not any(isinstance(s, (CopyStep, ConcatStep)) for s in plan.steps)
    _check(m, *params, x, y, rtol=1e-5)


def test_transpose_read_by_a_kernel_is_a_strided_load():
    y = RNG.standard_normal((48, 64)).astype(np.float32)
    m = _ir(lambda x, y: dq.exp(dq.transpose(x)) + y, X, y)
    (k,) = _plan(m).kernels
    strides = {inp.strides for inp in k.spec.inputs}
    assert (1, 48) in strides  # x read down its columns, nothing copied
    _check(m, X, y)


def test_shape_casts_are_views():
    m = _ir(lambda x: dq.reshape(dq.exp(x), (48, 64)) * 2.0, X)
    plan = _plan(m)
    assert len(plan.steps) == 1
    _check(m, X)
    r = dq.make_ir(lambda x: dq.reshape(dq.sum(x, axis=1), (8, 8)))(X)
    plan = _plan(r)
    assert len(plan.steps) == 1 and plan.results[0].chain == (("reshape", (8, 8)),)
    _check(r, X)


def test_values_read_by_two_kernels_are_recomputed_when_cheap_and_stored_when_not():
    big = RNG.standard_normal((512, 512)).astype(np.float32)

    def cheap(x):
        t = x + 1.0
        return dq.sum(t, axis=1), dq.max(t, axis=0)

    def costly(x):
        t = dq.exp(dq.tanh(dq.sin(x)))
        s = dq.sum(t, axis=1, keepdims=True)
        return t * s

    plan = _plan(_ir(cheap, big), rows=False)
    # t recomputed, never stored: the two reductions fold it in one pass (multi-output)
    (k,) = plan.kernels
    assert isinstance(k, MapReduceStep) and not k.outputs and len(k.reductions) == 2
    assert plan.arena_bytes == 0
    plan = _plan(_ir(costly, big), rows=False)
    temps = [s for s in plan.slots if s.role == TEMP and s.shape == (512, 512)]
    assert len(temps) == 1  # exp(tanh(sin(x))) written once, read by the sum and the product
    _check(_ir(costly, big), big, rtol=1e-5)


def test_siblings_of_one_iteration_space_share_a_kernel():
    def two(x):
        e = dq.exp(x)
        return e + 1.0, e * 2.0, dq.sum(e, axis=0)

    plan = _plan(_ir(two, X))
    maps = [
        k for k in plan.kernels if isinstance(k.spec, KernelSpec) or isinstance(k, MapReduceStep)
    ]
    # both results come from one kernel (whether e is also stored for the sum is the fusion
    # stage's cost-driven choice: tests/test_fusion_extract.py); the sum along the leading
    # axis shares that pass (multi-output fusion: tests/test_map_reduce_fusion.py)
    assert len(maps) == 1 and {r.slot for r in plan.results[:2]} <= set(maps[0].outputs)
    assert isinstance(maps[0], MapReduceStep) and maps[0].reductions == (plan.results[2].slot,)
    _check(_ir(two, X), X)


def test_temporaries_share_bytes_when_lifetimes_do_not_overlap():
    w = (RNG.standard_normal((48, 48)) / np.sqrt(48)).astype(np.float32)

    def chain(x, w):
        for _ in range(4):
            x = dq.tanh(x @ w)
        return x

    m = _ir(chain, X, w)
    plan = _plan(m)
    temps = [s for s in plan.slots if s.role == TEMP]
    assert sum(s.nbytes for s in temps) > plan.arena_bytes >= 2 * X.nbytes
    _check(m, X, w, rtol=1e-5)


def test_concatenate_and_returned_parameter_views():
    y = RNG.standard_normal((64, 16)).astype(np.float32)
    m = _ir(lambda x, y: (dq.concatenate([dq.exp(x), y], axis=1), dq.transpose(y), x), X, y)
    plan = _plan(m)
    assert any(isinstance(s, ConcatStep) for s in plan.steps)
    assert sum(isinstance(s, CopyStep) for s in plan.steps) == 2  # results never alias arguments
    _check(m, X, y)


def test_broadcast_operands_are_stride_zero_reads():
    col = RNG.standard_normal((64, 1)).astype(np.float32)
    row = RNG.standard_normal((48,)).astype(np.float32)
    m = _ir(lambda x, c, r: x * c + r, X, col, row)
    (k,) = _plan(m).kernels
    assert sorted(inp.strides or () for inp in k.spec.inputs) == [(), (0, 1), (1, 0)]
    _check(m, X, col, row)


def test_plan_text_names_kernels_values_and_buffers():
    m = _ir(lambda x: dq.softmax(dq.relu(x) @ dq.transpose(x), axis=1), X)
    text = str(_plan(m))
    assert text.startswith("plan @lambda:")
    for word in ("blas:", "rows", "reduce max, add", "return", "buffers:", "%x", ".T"):
        assert word in text


def test_apply_is_inlined_and_declared_adjoints_compile():
    m = dq.parse("""module "t"
stage raw
func @sq: (<3 x f32>) -> <3 x f32> {
'entry(%x: <3 x f32>):
    %y = multiply %x: <3 x f32>, %x: <3 x f32>
    return %y: <3 x f32>
}
func @f: (<3 x f32>) -> f32 {
'entry(%x: <3 x f32>):
    %s = apply @sq(%x: <3 x f32>): (<3 x f32>) -> <3 x f32>
    %t = apply @sq(%s: <3 x f32>): (<3 x f32>) -> <3 x f32>
    %r = reduce %t: <3 x f32> by add init 0: f32 along 0
    return %r: f32
}
[adjoint @f]
func @f_grad: (<3 x f32>) -> <3 x f32>
""")
    x = np.array([1.0, -2.0, 0.5], np.float32)
    assert float(dq.compile(m, "f")(x)) == pytest.approx(float(np.sum(x**4)), rel=1e-6)
    np.testing.assert_allclose(dq.compile(m, "f_grad")(x), 4 * x**3, rtol=1e-6)


def test_planning_a_long_program():
    # how long planning takes is measured by benchmarks/deep_programs.py, not asserted here:
    # this machine is shared, and a timed assertion fails whenever it is busy
    w = (RNG.standard_normal((48, 48)) / 7).astype(np.float32)

    def deep(x, w):
        for i in range(60):  # ~10 ops a layer: matmul, bias, activation, row statistics
            h = dq.tanh(x @ w + 0.1 * i)
            x = h - dq.mean(h, axis=1, keepdims=True) + dq.max(h, axis=0) * 0.01
        return x

    m = _ir(deep, X, w)
    plan = _plan(m)
    assert len(plan.blas_calls) == 60 and len(m["deep"].body) > 500


BIAS_GRAD = """module "t"
stage raw
func @f: (<4 x 3 x 5 x 6 x f32>) -> {results} {{
'entry(%x: <4 x 3 x 5 x 6 x f32>):
    %g = multiply %x: <4 x 3 x 5 x 6 x f32>, %x: <4 x 3 x 5 x 6 x f32>
    %a = reduce %g: <4 x 3 x 5 x 6 x f32> by add init 0.0: f32 along 3
    %b = shapeCast %a: <4 x 3 x 5 x f32> to 4 x 3 x 5 x 1
    %c = reduce %b: <4 x 3 x 5 x 1 x f32> by add init 0.0: f32 along 2
    %d = shapeCast %c: <4 x 3 x 1 x f32> to 4 x 3 x 1 x 1
    %e = reduce %d: <4 x 3 x 1 x 1 x f32> by {outer} init {init}: f32 along 0
    %t = literal (%e: <3 x 1 x 1 x f32>, %a: <4 x 3 x 5 x f32>): (<3 x 1 x 1 x f32>, <4 x 3 x 5 x f32>)
    return {returned}
}}
"""
GX = RNG.standard_normal((4, 3, 5, 6)).astype(np.float32)


def _reductions(plan):
    return [
        s.spec
        for s in plan.steps
        if isinstance(s, KernelStep) and not isinstance(s.spec, KernelSpec)
    ]


def test_a_bias_gradient_summed_one_axis_at_a_time_is_one_reduction():
    # how the adjoint sums a bias gradient: along 3, a shape cast keeping the 1, along 2, along 0
    m = dq.parse(
        BIAS_GRAD.format(
            results="<3 x 1 x 1 x f32>", outer="add", init="0.0", returned="%e: <3 x 1 x 1 x f32>"
        )
    )
    (spec,) = _reductions(_plan(m))
    assert spec.axes == (0, 2, 3) and spec.shape == (4, 3, 5, 6)
    _check(m, GX)


@pytest.mark.parametrize(
    "outer, init, results, returned, kernels",
    [
        # another reader of an inner sum: it is computed, and the reductions stay apart
        (
            "add",
            "0.0",
            "(<3 x 1 x 1 x f32>, <4 x 3 x 5 x f32>)",
            "%t: (<3 x 1 x 1 x f32>, <4 x 3 x 5 x f32>)",
            2,
        ),
        # another combinator: a max of sums is not one reduction
        ("max", "-inf", "<3 x 1 x 1 x f32>", "%e: <3 x 1 x 1 x f32>", 2),
        # an initial value on the outer one is added once
        ("add", "2.5", "<3 x 1 x 1 x f32>", "%e: <3 x 1 x 1 x f32>", 1),
    ],
)
def test_reductions_merge_only_where_the_result_is_the_same(
    outer, init, results, returned, kernels
):
    m = dq.parse(BIAS_GRAD.format(results=results, outer=outer, init=init, returned=returned))
    assert len(_reductions(_plan(m))) == kernels
    _check(m, GX)
