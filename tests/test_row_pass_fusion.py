"""Layer norm's two moments in one row pass (issue 36, multi-output fusion): the fusion stage
prices each reduction over trailing axes in one row pass with the other reductions and maps of
its rows (egraph/fusion_decision.py: `FusionDecision.row_pass`), and where it did, a row kernel
recomputes the per-row maps between its reductions that other kernels read (planning/
rowfusion.py, planning/map_reduce.copies_per_row_maps), so that the mean and the variance of
a row (and the backward's two row sums) are one pass instead of a kernel each.

- fires: a layer norm's value and gradient (forward moments, backward sums) as in the
  transformer step; the report names each shared pass, its reductions and the saving;
- does not fire: short rows in cache, DLVM_EQ_MULTI_OUTPUT=0, the gpu target (its row kernels
  are one thread per short row, and the decision prices no row pass there), a reduction alone
  on its rows (nothing to share), reductions over other axes of the same tensor;
- random programs of row reductions and per-row maps read elsewhere agree with the
  interpreter in float64 (hypothesis).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq import config
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.kernels.kernel_spec import ReduceSpec
from dlvm_eq.codegen.planning.map_reduce import MapReduceFusion
from dlvm_eq.codegen.planning.plan import RowStep
from dlvm_eq.codegen.planning.planner import rows_for
from dlvm_eq.egraph.fusion_decision import decide_fusion
from dlvm_eq.ir import interpret
from dlvm_eq.ir.inline import flatten
from dlvm_eq.pipeline import compile, plan_function

RNG = np.random.default_rng(3636)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _close(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w, np.float64)
        scale = max(1.0, float(np.abs(w).max(initial=0.0)))
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=1e-4, atol=1e-5 * scale)


def _module(fn, *args):
    m = dq.make_ir(fn)(*args)
    return m, next(iter(m.functions))


def _layer_norm_grad(shape):
    """A post-norm layer norm's value and gradient, as the transformer step's second one: the
    residual sum normalized, a gain and a bias, a mean squared error."""
    d = shape[-1]
    a, c, y = (RNG.standard_normal(shape).astype(np.float32) for _ in range(3))
    g = (1.0 + 0.1 * RNG.standard_normal((d,))).astype(np.float32)
    b = (0.1 * RNG.standard_normal((d,))).astype(np.float32)

    def loss(g, b, a, c, y):
        h = a + c
        mu = dq.mean(h, axis=-1, keepdims=True)
        var = dq.mean((h - mu) * (h - mu), axis=-1, keepdims=True)
        out = (h - mu) / dq.sqrt(var + 1e-5) * g + b
        return dq.mean((out - y) * (out - y))

    m, name = _module(dq.value_and_grad(loss, argnums=(0, 1, 2, 3)), g, b, a, c, y)
    return m, name, (g, b, a, c, y)


def _no_copies(monkeypatch):
    monkeypatch.setattr(MapReduceFusion, "copies_per_row_maps", lambda self, *a: False)


def _row_reductions(plan) -> list[int]:
    """The number of reductions of each row kernel of the plan."""
    return [len(k.spec.reductions) for k in plan.kernels if isinstance(k, RowStep)]


def _trailing_reduce_kernels(plan) -> list:
    """Reductions along the last axis left as kernels of their own."""
    return [
        k
        for k in plan.kernels
        if isinstance(k.spec, ReduceSpec) and len(k.spec.shape) - 1 in k.spec.axes
    ]


def _check(m, name, args, target="cpu"):
    plan = plan_function(m[name], m, target=target)
    if target == "cpu":
        _close(compile(m, name, optimize=False)(*args), interpret(m, name, *args, float64=True))
    return plan


# ---------------------------------------------------------------- where it fires


def test_layer_norm_moments_and_backward_sums_are_row_passes(monkeypatch):
    m, name, args = _layer_norm_grad((16, 128, 256))
    plan = _check(m, name, args)
    # forward: the mean and the variance; backward: the two row sums of the input gradient
    assert sorted(_row_reductions(plan)) == [2, 2]
    assert not _trailing_reduce_kernels(plan)
    decision = decide_fusion(flatten(m[name], m))
    assert len(decision.row_pass) >= 4 and all(s > 0 for s in decision.row_pass.values())
    # the report names the passes, their reductions and the model's saving
    text = str(plan.fusion)
    passes = [line for line in text.splitlines() if "one pass:" in line]
    for k in plan.kernels:
        if isinstance(k, RowStep):
            (line,) = [p for p in passes if p.startswith(f"    one pass: {k.name}: sum %")]
            assert line.count(", sum %") == 1 and line.endswith("us (model)"), line
    assert plan.fusion.row_shared >= 4 and plan.fusion.row_shared_saving > 0
    assert "row reductions sharing row passes" in text
    # without the copies of the per-row values (as before): the moments in kernels of their own
    _no_copies(monkeypatch)
    before = plan_function(m[name], m)
    assert len(before.kernels) > len(plan.kernels) and _trailing_reduce_kernels(before)


def test_the_per_row_values_other_kernels_read_keep_their_kernel():
    x = RNG.standard_normal((8, 8, 256)).astype(np.float32)

    def f(x):
        mu = dq.mean(x, axis=-1, keepdims=True)
        var = dq.mean((x - mu) * (x - mu), axis=-1, keepdims=True)
        r = dq.rsqrt(var + 1e-5)
        return (x - mu) * r, r * 2.0  # r read by the row kernel and returned

    m, name = _module(f, x)
    plan = _check(m, name, (x,))
    assert _row_reductions(plan) == [2] and not _trailing_reduce_kernels(plan)
    # rsqrt is computed in the row kernel and again, per row, for the result
    small = [k for k in plan.kernels if not isinstance(k, RowStep)]
    assert len(small) == 1 and small[0].spec.shape[:2] == (8, 8)


# ---------------------------------------------------------------- where it must not


def test_short_rows_in_cache_keep_separate_kernels(monkeypatch):
    m, name, args = _layer_norm_grad((64, 64, 32))  # rows of 32: measured 0.82x in one pass
    plan = _check(m, name, args)
    assert _trailing_reduce_kernels(plan)  # the separate kernels vectorize better (measured)
    _no_copies(monkeypatch)
    assert str(plan_function(m[name], m)).split("\n", 2)[2] == str(plan).split("\n", 2)[2]


def test_not_when_switched_off(monkeypatch):
    monkeypatch.setenv("DLVM_EQ_MULTI_OUTPUT", "0")
    config.reload()  # (conftest re-reads the restored environment after the test)
    m, name, args = _layer_norm_grad((16, 128, 256))
    assert not decide_fusion(flatten(m[name], m)).row_pass
    plan = _check(m, name, args)
    assert _trailing_reduce_kernels(plan) and not plan.fusion.row_shared


def test_not_on_the_gpu_target():
    m, name, _ = _layer_norm_grad((16, 128, 256))
    assert not decide_fusion(flatten(m[name], m), target="gpu", rows=False).row_pass
    plan = plan_function(m[name], m, rows=rows_for("gpu"), target="gpu")
    assert not plan.fusion.row_shared and _trailing_reduce_kernels(plan)


def test_a_reduction_alone_on_its_rows_is_not_priced_as_shared():
    x = RNG.standard_normal((16, 512)).astype(np.float32)
    m, name = _module(lambda x: dq.sum(x, axis=-1), x)
    assert not decide_fusion(flatten(m[name], m)).row_pass
    plan = _check(m, name, (x,))
    assert not plan.fusion.passes


def test_a_reduction_over_other_axes_stays_out_of_the_row_pass():
    x = RNG.standard_normal((4, 8, 256)).astype(np.float32)

    def f(x):
        mu = dq.mean(x, axis=-1, keepdims=True)
        var = dq.mean((x - mu) * (x - mu), axis=-1, keepdims=True)
        r = dq.rsqrt(var + 1e-5)
        return (x - mu) * r, dq.sum(x * r, axis=(1, 2))  # rows (4, 8), then (4,)

    m, name = _module(f, x)
    plan = _check(m, name, (x,))
    for k in plan.kernels:
        if isinstance(k, RowStep):
            assert k.spec.cols == 256
    assert 2 in _row_reductions(plan)


# ---------------------------------------------------------------- random programs

# moments and per-row values that keep the rows of order 1 (so that float32 against float64 is
# a fair comparison after three steps): centred rows scaled by at most 1
_ROW = [
    lambda a: dq.mean(a, axis=-1, keepdims=True),
    lambda a: dq.max(a, axis=-1, keepdims=True),
    lambda a: dq.mean(a * a, axis=-1, keepdims=True),
]
_PER_ROW = [
    lambda r: dq.rsqrt(r * r + 1.0),
    lambda r: 1.0 / (1.0 + dq.abs(r)),
    lambda r: dq.exp(-dq.abs(r)),
]


@st.composite
def _programs(draw):
    lead = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=2)))
    cols = draw(st.sampled_from([256, 300, 40]))
    steps = [
        (draw(st.integers(0, 2)), draw(st.integers(0, 2)), draw(st.booleans()))
        for _ in range(draw(st.integers(1, 3)))
    ]
    return lead + (cols,), steps


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_programs())
def test_random_row_moments_agree_with_the_interpreter(program):
    shape, steps = program

    def f(x):
        a, outs = x, []
        for i, j, expose in steps:  # a moment of the current rows, a per-row value of it
            p = _PER_ROW[j](_ROW[i](a))
            a = (a - _ROW[i](a)) * p
            if expose:  # read by another kernel too: the row kernel recomputes it
                outs.append(p * 3.0)
        return (a, *outs)

    x = RNG.standard_normal(shape).astype(np.float32)
    m, name = _module(f, x)
    _check(m, name, (x,))
