"""The native attention backward's block products through our GEMM (issue 33,
codegen/cpu/attention_backward_ir.py, codegen/runtime/attention_backward.py): the score
recompute on each head's K packed once (attention_cpu.packed_keys, the forward's packing) and
dP on its V packed the same way, the others per product; against the float64 interpreter's
`attentionBackward` with padding, dense and causal masks and ragged blocks, every choice of
products against all-OpenBLAS, and the shipped blocks taking the shipped choice (a spy)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlvm_eq.codegen.runtime import attention_backward as ab
from dlvm_eq.codegen.runtime import attention_cpu
from dlvm_eq.codegen.runtime.attention_cpu import attention_forward
from dlvm_eq.ir.attention_op import KEY_BLOCK, QUERY_BLOCK
from dlvm_eq.ir.attention_op import attention as reference_forward
from dlvm_eq.ir.attention_op import attention_backward as reference_backward

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
ALL_BLAS, ALL_OURS = (False,) * 5, (True,) * 5


def _nr() -> int:
    gemm = attention_cpu.own_qk_gemm(1 << 12, 1)
    if gemm is None or attention_cpu.sgemm_pointer() is None:
        pytest.skip("our GEMM is off (DLVM_EQ_GEMM=0) or no cblas OpenBLAS is loaded")
    return gemm.spec.nr


def _inputs(rng, batch, m, n, d, e, mask):
    q, k, v, g = (
        rng.standard_normal(batch + s).astype(np.float32) for s in ((m, d), (n, d), (n, e), (m, e))
    )
    bias: np.ndarray | float = 0.0
    if mask == "padding":  # per batch index, the keys past a random length are -inf
        keep = np.arange(n) < rng.integers(1, n + 1, size=batch + (1, 1))
        bias = np.where(keep, 0.0, -np.inf).astype(np.float32)
    elif mask == "dense":
        bias = rng.standard_normal(batch + (m, n)).astype(np.float32)
    return q, k, v, g, bias


def _backward(q, k, v, g, bias, scale, causal, blocks, ours):
    """dq, dk, dv from the native task with these products on our GEMM (the forward's o and
    log-sum-exp first)."""
    o = np.empty(g.shape, np.float32)
    lse = np.empty(q.shape[:-1], np.float32)
    attention_forward(q, k, v, bias, scale, causal, o, 2, blocks, lse=lse)
    grads = [np.full(a.shape, np.nan, np.float32) for a in (q, k, v)]
    assert ab.native_backward(q, k, v, bias, scale, causal, o, g, *grads, lse, 2, blocks, ours)
    return grads


def _want(q, k, v, g, bias, scale, causal):
    args = [np.asarray(a, np.float64) for a in (q, k, v, bias)]
    o = reference_forward(args, {"scale": scale, "causal": causal})
    attrs = {"scale": scale, "causal": causal}
    return [
        reference_backward([*args, o, g.astype(np.float64)], {**attrs, "wrt": w}) for w in range(3)
    ]


def _close(got, want, d):
    for a, w in zip(got, want):
        seen = np.isfinite(w)  # causal rows with no key: NaN in both
        np.testing.assert_array_equal(np.isfinite(a), seen)
        tol = 3e-5 * max(1.0, np.abs(w[seen]).max(initial=0.0)) * max(1.0, np.sqrt(d) / 4)
        np.testing.assert_allclose(a[seen], w[seen], rtol=0, atol=tol)


@settings(max_examples=30, deadline=None)
@given(
    batch=st.sampled_from([(1,), (2,), (1, 3)]),
    m=st.integers(1, 150),
    n=st.integers(1, 300),
    d=st.sampled_from([1, 7, 64, 100, 300]),  # 300: two K slices of our GEMM (KC 256)
    e=st.sampled_from([1, 5, 20, 64]),
    mask=st.sampled_from(["none", "padding", "dense"]),
    causal=st.booleans(),
    panels=st.integers(1, 3),
    query_block=st.sampled_from([16, 37, 64]),
    ours=st.sampled_from([None, ALL_OURS] + [tuple(i == j for j in range(5)) for i in range(5)]),
    seed=st.integers(0, 2**16),
)
def test_products_on_our_gemm_match_the_float64_interpreter(
    batch, m, n, d, e, mask, causal, panels, query_block, ours, seed
):
    """Key blocks of whole panels, a ragged last key block and query tile, with masks: the
    shipped choice (None), all five products on ours, or one at a time."""
    rng = np.random.default_rng(seed)
    q, k, v, g, bias = _inputs(rng, batch, m, n, d, e, mask)
    scale = 1.0 / np.sqrt(d)
    blocks = (query_block, panels * _nr())
    got = _backward(q, k, v, g, bias, scale, causal, blocks, ours)
    _close(got, _want(q, k, v, g, bias, scale, causal), d)


@pytest.mark.parametrize("causal", [False, True])
def test_every_choice_of_products_agrees_with_openblas(causal):
    """All 32 choices of ours/OpenBLAS per product give the all-OpenBLAS gradients within
    float32 rounding (strided q and k views, a padding mask, a ragged last key block)."""
    nr = _nr()
    rng = np.random.default_rng(3)
    qkv = rng.standard_normal((1, 3 * nr + 5, 3, 2, 64)).astype(np.float32)  # (B, T, 3, H, d)
    q, k, v = (np.moveaxis(qkv[:, :, i], 2, 1) for i in range(3))  # (B, H, T, d) views
    g = rng.standard_normal(q.shape).astype(np.float32)
    pad = np.zeros((1, 1, 1, q.shape[2]), np.float32)
    pad[..., -7:] = -np.inf
    blocks = (40, 2 * nr)
    base = _backward(q, k, v, g, pad, 0.125, causal, blocks, ALL_BLAS)
    for ours in itertools.product([False, True], repeat=5):
        got = _backward(q, k, v, g, pad, 0.125, causal, blocks, ours)
        for a, b in zip(got, base):
            np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * np.abs(b).max(), err_msg=ours)


def test_the_shipped_blocks_take_the_shipped_products(monkeypatch):
    """At the shipped tiles the compiled task is the one with OURS's products on our GEMM (the
    score recompute among them), and it falls back to all-OpenBLAS under DLVM_EQ_GEMM=0's
    own_qk_gemm = None, with the same gradients."""
    _nr()
    assert ab.OURS[0], "the score recompute runs through our GEMM on packed K"
    taken = []
    native = ab._native

    def spy(*args):
        taken.append(args[3])
        return native(*args)

    monkeypatch.setattr(ab, "_native", spy)
    rng = np.random.default_rng(4)
    q, k, v, g, bias = _inputs(rng, (1, 2), 600, 600, 64, 64, "dense")
    blocks = (QUERY_BLOCK, KEY_BLOCK)
    ours = _backward(q, k, v, g, bias, 0.125, False, blocks, None)
    monkeypatch.setattr(ab, "own_qk_gemm", lambda kb, d: None)
    blas = _backward(q, k, v, g, bias, 0.125, False, blocks, None)
    assert taken == [ab.OURS, ALL_BLAS]
    for a, b in zip(ours, blas):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * np.abs(b).max())
    _close(ours, _want(q, k, v, g, bias, 0.125, False), 64)


def test_packed_row_blocks_lays_each_block_out_as_its_own_b_operand():
    """Block r0 of each head at r0 * w, as (w / nr, rows, nr) panels of x[r0:r1], zeros past
    the last column (the ragged last block too)."""
    x = np.arange(2 * 7 * 5, dtype=np.float32).reshape(2, 7, 5)
    got = attention_cpu.packed_row_blocks(x, (2,), 4, 3)
    assert got.shape == (2, 7 * 8)
    for h in range(2):
        for r0 in (0, 3, 6):
            r1 = min(7, r0 + 3)
            block = got[h, r0 * 8 : r1 * 8].reshape(2, r1 - r0, 4)
            want = np.zeros((r1 - r0, 8), np.float32)
            want[:, :5] = x[h, r0:r1]
            np.testing.assert_array_equal(block, want.reshape(r1 - r0, 2, 4).transpose(1, 0, 2))
