"""Softmax's max, sum and map in one pass (issue 36's multi-output fusion), in two cases the row
kernels (codegen/planning/rowfusion.py) missed:
- a constant read broadcast over leading axes the row kernel's (rows, cols) view cannot express,
  a causal mask (T, T) over (B, T, T) scores: broadcast at plan time (`row_constant`); not for
  parameters, constants above ROW_CONSTANT_BYTES, or where no reduction is fused;
- per-row values computed on the reduced shape itself (the log of the sum in softmax
  cross-entropy's gradient, (B, T) rather than (B, T, 1)), for long rows or large row spaces.
Every plan runs against the reference interpreter (float64)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.planning.plan import CONST, RowStep
from dlvm_eq.codegen.planning.rowfusion import ROW_CONSTANT_BYTES, ROW_VALUE_MIN_COLS
from dlvm_eq.ir import interpret
from dlvm_eq.pipeline import compile, plan_function

RNG = np.random.default_rng(5)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _plan_and_check(fn, *args):
    m = dq.make_ir(fn)(*args)
    name = next(iter(m.functions))
    plan = plan_function(m[name], m)
    got = compile(m, name, optimize=False)(*args)
    want = interpret(m, name, *args, float64=True)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    return plan


def _causal(T):
    return np.tril(np.ones((T, T), bool))


def _rows(plan):
    return [s for s in plan.steps if isinstance(s, RowStep)]


def test_causal_softmax_over_a_batch_is_one_row_kernel():
    mask = _causal(16)
    s = RNG.standard_normal((4, 16, 16)).astype(np.float32)
    plan = _plan_and_check(lambda s: dq.softmax(dq.where(mask, s, -1e9), axis=-1), s)
    assert len(plan.steps) == 1 and len(_rows(plan)) == 1
    (row,) = _rows(plan)
    assert len(row.spec.reductions) == 2  # the max and the sum share the pass
    wide = [c for c in plan.slots if c.role == CONST and tuple(c.shape) == (4, 16, 16)]
    assert len(wide) == 1 and wide[0].dtype == "bool"


def test_the_same_mask_twice_is_broadcast_once():
    mask = _causal(8)
    s = RNG.standard_normal((3, 8, 8)).astype(np.float32)

    def f(s):
        a = dq.softmax(dq.where(mask, s, -1e9), axis=-1)
        return a + dq.where(mask, a, 0.0)

    plan = _plan_and_check(f, s)
    wide = [c for c in plan.slots if c.role == CONST and tuple(c.shape) == (3, 8, 8)]
    assert len(wide) == 1


def test_a_mask_given_as_a_parameter_is_not_broadcast():
    s = RNG.standard_normal((4, 16, 16)).astype(np.float32)
    hidden = 1.0 - _causal(16).astype(np.float32)  # 1 above the diagonal
    plan = _plan_and_check(lambda s, m: dq.softmax(s + m * -1e9, axis=-1), s, hidden)
    assert not _rows(plan)  # the parameter is read at (0, 16, 1): no row kernel can
    assert not [c for c in plan.slots if c.role == CONST and tuple(c.shape) == (4, 16, 16)]


def test_a_constant_larger_than_the_limit_is_not_broadcast():
    T = 64
    B = ROW_CONSTANT_BYTES // (T * T) + 1  # bool: one byte an element
    mask = _causal(T)
    s = RNG.standard_normal((B, T, T)).astype(np.float32)
    plan = _plan_and_check(lambda s: dq.softmax(dq.where(mask, s, -1e9), axis=-1), s)
    assert not _rows(plan)


def test_a_masked_map_without_a_reduction_keeps_the_mask_as_it_is():
    mask = _causal(16)
    s = RNG.standard_normal((4, 16, 16)).astype(np.float32)
    plan = _plan_and_check(lambda s: dq.exp(dq.where(mask, s, -1e9)), s)
    assert not [c for c in plan.slots if c.role == CONST and tuple(c.shape) == (4, 16, 16)]


def test_softmax_cross_entropy_value_and_gradient_is_one_row_pass():
    """max, sum of exp, the label sum and the gradient's map: one row kernel (were 4 kernels)."""
    plan = _cross_entropy_plan(4, 16, ROW_VALUE_MIN_COLS)  # long rows
    (row,) = _rows(plan)
    assert len(row.spec.reductions) == 3 and len(plan.kernels) == 3


def test_softmax_cross_entropy_with_short_rows_in_cache_keeps_its_kernels():
    """(16, 32, 64): the four kernels measured faster than one row kernel (rowfusion.py)."""
    plan = _cross_entropy_plan(16, 32, 64)
    assert not _rows(plan) and len(plan.kernels) == 7


def _cross_entropy_plan(B, T, V):
    # large enough that the fusion decision keeps the per-row log and divide in a buffer
    x = RNG.standard_normal((B, T, V)).astype(np.float32)
    y = np.eye(V, dtype=np.float32)[RNG.integers(0, V, (B, T))]
    vg = dq.value_and_grad(lambda x, y: dq.mean(dq.softmax_cross_entropy(x, y)), argnums=0)
    m = dq.make_ir(vg)(x, y)
    name = list(m.functions)[-1]
    want = interpret(m, name, x, y, float64=True)
    got = compile(m, name, optimize=False)(x, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)
    return plan_function(m[name], m)


def test_a_per_row_value_read_along_the_trailing_axes_is_not_a_row_value():
    """A (B, T) value read as the trailing axes of (B, T, T) (numpy broadcasting, not per
    row) keeps its own kernel, and the program still agrees."""
    x = RNG.standard_normal((4, 6, 6)).astype(np.float32)

    def f(x):
        r = dq.log(dq.sum(dq.exp(x), axis=2))  # (4, 6) -- only 4 x 6: reads right-aligned below
        return dq.softmax(x, axis=-1) * dq.reshape(r[0], (1, 1, 6))

    _plan_and_check(f, x)


@settings(
    deadline=None,
    derandomize=True,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_random_masked_reductions_agree_with_the_interpreter(data):
    """Random rank-3 programs: a constant of random trailing shape (broadcast over the leading
    axes) masks or offsets the input, then a softmax, log-softmax, two-moment normalization
    or max-and-sum row pattern over the last axis, then a reduction over random axes."""
    B = data.draw(st.integers(2, 4))  # a batch: the constant is broadcast over it
    T = data.draw(st.integers(2, 9))
    C = data.draw(st.integers(1, 12))
    const_shape = data.draw(st.sampled_from([(C,), (T, C), (1, C), (T, 1)]))
    c = RNG.standard_normal(const_shape).astype(np.float32)
    use_mask = data.draw(st.booleans())
    pattern = data.draw(st.sampled_from(["softmax", "log_softmax", "moments", "maxsum"]))
    axes = data.draw(st.sampled_from([None, 0, 1, 2, (0, 2), (0, 1)]))
    x = RNG.standard_normal((B, T, C)).astype(np.float32)

    def f(x):
        h = dq.where(c > 0.0, x, -30.0) if use_mask else x + c
        if pattern == "softmax":
            h = dq.softmax(h, axis=-1)
        elif pattern == "log_softmax":
            h = dq.log_softmax(h, axis=-1)
        elif pattern == "moments":
            mu = dq.mean(h, axis=-1, keepdims=True)
            h = (h - mu) * dq.rsqrt(dq.mean(dq.square(h - mu), axis=-1, keepdims=True) + 1e-3)
        else:
            h = h - dq.max(h, axis=-1, keepdims=True) + dq.sum(h, axis=-1, keepdims=True)
        return dq.sum(h * x, axis=axes)

    grad = data.draw(st.booleans())  # the gradient too: per-row values on the reduced shape
    m = dq.make_ir(dq.value_and_grad(lambda x: dq.sum(f(x))) if grad else f)(x)
    name = list(m.functions)[-1]
    want = interpret(m, name, x, float64=True)
    for optimize in (False, True):
        got = compile(m, name, optimize=optimize)(x)
        for g, w in zip(*(v if grad else (v,) for v in (got, want))):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
