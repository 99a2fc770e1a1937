"""The native attention backward task (codegen/cpu/attention_backward_ir.py, issue 33): it
runs (float32 with a cblas OpenBLAS), its results equal float64 PyTorch with a scalar bias, the
numpy fallback (float64) and strided rows, and rank-3 value_and_grad at head dim 64 extracts
the fused backward (dV's node reads dO in O's place, rules/attention_adjoint.egg)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_attention_backward import assert_close, torch64

import dlvm_eq as dq
from dlvm_eq.codegen.runtime import attention_backward as ab
from dlvm_eq.codegen.runtime.attention_cpu import attention_forward, sgemm_pointer

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _run(q, k, v, g, bias, scale, causal, blocks=(16, 32), dtype=np.float32):
    q, k, v, g = (np.asarray(a, dtype) for a in (q, k, v, g))
    o = np.empty(g.shape, dtype)
    lse = np.empty(q.shape[:-1], dtype)
    attention_forward(q, k, v, bias, scale, causal, o, 2, blocks, lse=lse)
    grads = [np.full(a.shape, np.nan, dtype) for a in (q, k, v)]
    ab.attention_backward(q, k, v, bias, scale, causal, o, g, *grads, lse, 2, blocks)
    return grads


def _inputs(rng, batch, m, n, d, e):
    shapes = (batch + (m, d), batch + (n, d), batch + (n, e), batch + (m, e))
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def test_float32_runs_the_native_task(monkeypatch):
    if sgemm_pointer() is None:
        pytest.skip("no cblas OpenBLAS loaded: the numpy fallback runs (tested below)")
    calls = []
    real = ab.native_backward
    monkeypatch.setattr(ab, "native_backward", lambda *a: calls.append(real(*a)) or calls[-1])
    rng = np.random.default_rng(1)
    _run(*_inputs(rng, (2,), 20, 30, 8, 8), 0.0, 0.5, False)
    assert calls == [True]


@pytest.mark.parametrize("causal", [False, True])
def test_a_scalar_bias_changes_nothing(causal):
    """softmax(s + c) = softmax(s): the forward's log-sum-exp includes c, the backward's P
    subtracts it (before, the native forward left c out of it and P was off by e^c)."""
    rng = np.random.default_rng(2)
    q, k, v, g = _inputs(rng, (2,), 33, 45, 8, 6)
    got = _run(q, k, v, g, 0.75, 0.4, causal)
    for a, b in zip(got, torch64(q, k, v, g, 0.0, 0.4, causal)):
        assert_close(a, b)


@settings(max_examples=15, deadline=None)
@given(
    m=st.integers(1, 50),
    n=st.integers(1, 50),
    causal=st.booleans(),
    dense=st.booleans(),
    blocks=st.sampled_from([(8, 16), (16, 8), (32, 64)]),
    seed=st.integers(0, 2**16),
)
def test_native_equals_the_numpy_fallback_and_float64_torch(m, n, causal, dense, blocks, seed):
    """float32 (native) and float64 (the numpy fallback: ab.attention_backward's own loop)
    against float64 PyTorch, on random shapes and tile sizes with dense biases."""
    rng = np.random.default_rng(seed)
    q, k, v, g = _inputs(rng, (2,), m, n, 5, 7)
    bias = rng.standard_normal((2, m, n)).astype(np.float32) if dense else np.float32(0.0)
    want = torch64(q, k, v, g, bias, 0.5, causal)
    if causal and m > n:  # rows past the last key see none of them: NaN, as the naive form
        want = [np.nan_to_num(w) for w in want]
    for dtype in (np.float32, np.float64):
        got = _run(q, k, v, g, bias, 0.5, causal, blocks, dtype)
        if causal and m > n:
            got = [np.nan_to_num(a) for a in got]
        for a, b in zip(got, want):
            assert_close(a, b, 2e-5 if dtype == np.float32 else 1e-12)


def test_strided_rows_are_read_in_place():
    """q, k, v and dO as every other row of a larger array (row strides of 2 rows)."""
    rng = np.random.default_rng(3)
    big = _inputs(rng, (2,), 2 * 40, 2 * 50, 8, 6)
    q, k, v, g = big[0][:, ::2], big[1][:, ::2], big[2][:, ::2], big[3][:, ::2]
    got = _run(q, k, v, g, 0.0, 0.3, True)
    for a, b in zip(got, torch64(q, k, v, g, 0.0, 0.3, True)):
        assert_close(a, b)


def rank3(q, k, v):
    return dq.sum(dq.softmax((q @ dq.transpose(k, (0, 2, 1))) * 0.125, axis=-1) @ v)


def test_rank3_head_dim_64_extracts_the_fused_backward():
    """Before, the plain rank-3 adjoint was kept here: the fused dV node's cost set carried
    the forward that the plain dV does not read. Gradients against float64 PyTorch."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 1024, 64)).astype(np.float32) for _ in range(3))
    step = dq.jit(dq.value_and_grad(rank3, argnums=(0, 1, 2)))
    _, grads = step(q, k, v)
    plan = str(step.report(q, k, v).plan)
    assert plan.count("attentionBackward(") == 1, plan  # dQ, dK, dV: one kernel
    want = torch64(q, k, v, np.ones(q.shape, np.float32), 0.0, 0.125, False)
    for a, b in zip(grads, want):
        assert_close(a, b, 1e-4)
