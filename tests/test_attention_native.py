"""The native float32 attention task (codegen/cpu/attention_ir.py through
runtime/attention_cpu.py) against the float64 interpreter where its wrapper does more than the
hypothesis test in test_attention_kernel.py: strided views (a transposed k, a head-split q),
-inf padding, the shipped block sizes, Q Kᵀ through our GEMM on packed keys (hypothesis), a
non-finite scalar bias and float64 (numpy's blocks), and many threads calling it at once."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlvm_eq.codegen.runtime import attention_cpu
from dlvm_eq.ir.attention_op import attention as reference


def _want(q, k, v, bias, scale, causal):
    args = [np.asarray(a, np.float64) for a in (q, k, v, bias)]
    return reference(args, {"scale": scale, "causal": causal})


def test_the_float32_kernel_is_the_native_one():
    q = np.ones((1, 4, 8), np.float32)
    out = np.empty_like(q)
    assert attention_cpu.native_forward(q, q, q, 0.0, 1.0, False, out, 1, (128, 512))


@pytest.mark.parametrize("causal", [False, True])
def test_strided_views_and_minus_inf_padding_at_the_shipped_blocks(causal):
    rng = np.random.default_rng(5)
    qkv = rng.standard_normal((2, 700, 3, 2, 16)).astype(np.float32)  # (B, T, 3, H, d)
    q, k, v = (np.moveaxis(qkv[:, :, i], 2, 1) for i in range(3))  # (B, H, T, d) views
    k = np.swapaxes(np.ascontiguousarray(np.swapaxes(k, -1, -2)), -1, -2)  # column-major rows
    pad = np.zeros((2, 1, 1, 700), np.float32)
    pad[1, ..., -150:] = -np.inf
    out = np.empty((2, 2, 700, 16), np.float32)
    attention_cpu.attention_forward(q, k, v, pad, 0.25, causal, out)
    np.testing.assert_allclose(out, _want(q, k, v, pad, 0.25, causal), rtol=2e-5, atol=2e-5)


def test_a_non_finite_scalar_bias_and_float64_take_numpy_blocks():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 40, 8)) for _ in range(3))
    out = np.empty((2, 40, 8))
    assert not attention_cpu.native_forward(q, k, v, 0.0, 0.5, False, out, 1, (16, 16))
    attention_cpu.attention_forward(q, k, v, 0.0, 0.5, True, out, blocks=(16, 16))
    np.testing.assert_allclose(out, _want(q, k, v, 0.0, 0.5, True), rtol=1e-12)
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    out32 = np.empty((2, 40, 8), np.float32)
    attention_cpu.attention_forward(q32, k32, v32, -np.inf, 0.5, False, out32)
    assert np.isnan(out32).all()  # every key hidden: NaN, as the naive formula


def test_many_threads_calling_at_once_agree_with_one():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 300, 16)).astype(np.float32) for _ in range(3))
    want = np.empty_like(q)
    attention_cpu.attention_forward(q, k, v, 0.0, 0.25, True, want, threads=1)
    outs = [np.empty_like(q) for _ in range(6)]
    errors = []

    def call(out):
        try:
            for _ in range(3):
                attention_cpu.attention_forward(q, k, v, 0.0, 0.25, True, out, threads=2)
        except Exception as exc:  # reported below, with the thread's error
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(o,)) for o in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for out in outs:
        np.testing.assert_array_equal(out, want)


def test_openblas_threads_are_restored_after_concurrent_calls():
    libs = attention_cpu.openblas_libraries()
    if not libs:
        pytest.skip("no OpenBLAS with a thread-count setter is loaded")
    before = [get() for get, _ in libs]
    test_many_threads_calling_at_once_agree_with_one()
    assert [get() for get, _ in libs] == before


def _nr() -> int:
    gemm = attention_cpu.own_qk_gemm(1 << 12, 1)
    assert gemm is not None, "the forward's Q Kᵀ runs through our GEMM unless DLVM_EQ_GEMM=0"
    return gemm.spec.nr


@settings(max_examples=30, deadline=None)
@given(
    batch=st.sampled_from([(1,), (2,), (1, 3)]),
    m=st.integers(1, 150),
    n=st.integers(1, 300),
    d=st.sampled_from([1, 7, 64, 100, 300]),  # 300: two K slices of our GEMM (KC 256)
    e=st.integers(1, 20),
    mask=st.sampled_from(["none", "padding", "dense"]),
    causal=st.booleans(),
    panels=st.integers(1, 3),
    query_block=st.sampled_from([16, 37, 64]),
    seed=st.integers(0, 2**16),
)
def test_qk_through_our_gemm_on_packed_keys_matches_the_interpreter(
    batch, m, n, d, e, mask, causal, panels, query_block, seed
):
    """Key blocks of whole panels: Q Kᵀ runs through our GEMM on each head's K packed once,
    across several key blocks (a ragged last one) and query blocks, with masks."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(batch + (m, d)).astype(np.float32)
    k = rng.standard_normal(batch + (n, d)).astype(np.float32)
    v = rng.standard_normal(batch + (n, e)).astype(np.float32)
    bias: np.ndarray | float = 0.0
    if mask == "padding":
        bias = np.zeros(batch[:1] + (1,) * (len(batch) - 1) + (1, n), np.float32)
        bias[..., n - n // 3 :] = -np.inf  # the last third of the keys hidden
    elif mask == "dense":
        bias = rng.standard_normal(batch + (m, n)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    key_block = panels * _nr()
    assert attention_cpu.own_qk_gemm(key_block, d) is not None
    out = np.empty(batch + (m, e), np.float32)
    attention_cpu.attention_forward(
        q, k, v, bias, scale, causal, out, threads=2, blocks=(query_block, key_block)
    )
    want = _want(q, k, v, bias, scale, causal)
    np.testing.assert_allclose(out, want, rtol=3e-5, atol=3e-5 * max(1.0, np.sqrt(d) / 4))


def test_our_gemm_and_openblas_give_the_same_scores_within_rounding(monkeypatch):
    """The two ways of the forward's Q Kᵀ (ours, OpenBLAS's sgemm) on one input; and ours is
    the one the shipped blocks take (the compiled task's own_qk flag)."""
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 2, 700, 64)).astype(np.float32) for _ in range(3))
    taken = []
    native = attention_cpu._native

    def spy(*args):
        taken.append(args[3])
        return native(*args)

    monkeypatch.setattr(attention_cpu, "_native", spy)
    ours = np.empty_like(q)
    attention_cpu.attention_forward(q, k, v, 0.0, 0.125, True, ours)
    monkeypatch.setattr(attention_cpu, "own_qk_gemm", lambda kb, d: None)
    blas = np.empty_like(q)
    attention_cpu.attention_forward(q, k, v, 0.0, 0.125, True, blas)
    assert taken == [True, False]
    np.testing.assert_allclose(ours, blas, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours, _want(q, k, v, 0.0, 0.125, True), rtol=2e-5, atol=2e-5)
