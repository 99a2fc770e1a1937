"""A scan's small products with a loop-invariant weight run through our GEMM reading the weight
packed once per call (codegen/execution/packed_products.py, cpu/gemm_ir.py's B_PACKED flag,
issue 30): the packed layout against its index formula; the GEMM on a packed B against float64
numpy and bit-identical to the same GEMM packing B itself, on random shapes (K over several
slices, transposed A and B, ragged edges); which records are rewritten and which are not; and
an LSTM through dq.scan with its weights packed, against float64 PyTorch and against the same
program on OpenBLAS and the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.codegen.cpu.gemm_ir import B_PACKED
from dlvm_eq.codegen.execution import native_loop, packed_products
from dlvm_eq.codegen.planning.loop_plan import (
    CALL,
    NO_TRANS,
    SGEMM,
    TRANS,
    LoopPlan,
    Ptr,
    Record,
)
from dlvm_eq.codegen.runtime import gemm_runtime
from dlvm_eq.codegen.runtime.gemm_runtime import (
    CpuGemm,
    pack_b_panels,
    packed_b_gemm,
    shared_gemm,
)
from dlvm_eq.codegen.runtime.gemm_tiles import AVX512_SHORT, AVX512_WIDE, padded_rows

RNG = np.random.default_rng(30)


def test_packed_panels_follow_the_layout_the_gemm_reads():
    for k, n, nr in [(3, 5, 2), (4, 16, 8), (2, 17, 16)]:
        b = RNG.standard_normal((n, k)).astype(np.float32).T  # a transposed view too
        got = pack_b_panels(b, nr)
        assert got.shape == (-(-n // nr), k, nr)
        for p in range(got.shape[0]):
            for kk in range(k):
                for j in range(nr):
                    want = b[kk, p * nr + j] if p * nr + j < n else 0.0
                    assert got[p, kk, j] == want, (k, n, nr, p, kk, j)


_GEMMS: dict = {}


def _avx512(tile: str = "avx512"):
    """The AVX-512 12 x 32 tile, or its 8 x 32 one for few rows ("avx512short"); their
    16-lane vectors run as two 8-lane halves on AVX2."""
    if tile not in _GEMMS:
        shape = AVX512_SHORT if tile == "avx512short" else AVX512_WIDE
        _GEMMS[tile] = CpuGemm(threads=1, tile=shape)
    return _GEMMS[tile]


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 600),
    n=st.integers(1, 70),
    a_by_cols=st.booleans(),
    b_transposed=st.booleans(),
    tile=st.sampled_from(["host", "avx512", "avx512short"]),
)
def test_gemm_on_a_packed_b_equals_float64_and_the_gemm_packing_b_itself(
    m, k, n, a_by_cols, b_transposed, tile
):
    g = shared_gemm(False) if tile == "host" else _avx512(tile)
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((n, k)).astype(np.float32).T if b_transposed else None
    if b is None:
        b = RNG.standard_normal((k, n)).astype(np.float32)
    a_in = np.asfortranarray(a) if a_by_cols else a
    rsa, csa = a_in.strides[0] // 4, a_in.strides[1] // 4
    flags = g.layout_flags("cols" if a_by_cols else "rows", rsa, False) | B_PACKED
    packed = pack_b_panels(b, g.spec.nr)
    scratch = np.empty(g.spec.scratch(n)[0], np.float32)
    out = np.full((m, n), np.nan, np.float32)
    args = [0, m, 0, n, k, a_in.ctypes.data, rsa, csa, packed.ctypes.data, 0, 0]
    g._fn(*args, out.ctypes.data, n, scratch.ctypes.data, None, flags, None, None)
    want = a.astype(np.float64) @ b.astype(np.float64)
    bound = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * bound.max() + 1e-30)
    # the same GEMM packing B itself, one block (the same K slices and order): the same bits
    ours = np.empty_like(out)
    pack_b = np.empty(g.spec.scratch(n)[1], np.float32)
    g._fn(
        0, m, 0, n, k, a_in.ctypes.data, rsa, csa, b.ctypes.data, b.strides[0] // 4,
        b.strides[1] // 4, ours.ctypes.data, n, scratch.ctypes.data, pack_b.ctypes.data,
        g.flags(a_in, b), None, None,
    )  # fmt: skip
    np.testing.assert_array_equal(out, ours)


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 600), n=st.integers(1, 70), a_by_cols=st.booleans())
def test_the_short_tile_gives_the_wide_tiles_bits_on_one_packed_b(m, k, n, a_by_cols):
    """packed_b_gemm may run a product through either AVX-512 tile: both read the same panels
    (one NR) and sum each element in the same order, so a program's result is the same bits."""
    a = RNG.standard_normal((m, k)).astype(np.float32)
    a_in = np.asfortranarray(a) if a_by_cols else a
    b = RNG.standard_normal((k, n)).astype(np.float32)
    rsa, csa = a_in.strides[0] // 4, a_in.strides[1] // 4
    outs = []
    for tile in ("avx512", "avx512short"):
        g = _avx512(tile)
        packed = pack_b_panels(b, g.spec.nr)
        scratch = np.empty(g.spec.scratch(n)[0], np.float32)
        out = np.full((m, n), np.nan, np.float32)
        flags = g.layout_flags("cols" if a_by_cols else "rows", rsa, False) | B_PACKED
        args = [0, m, 0, n, k, a_in.ctypes.data, rsa, csa, packed.ctypes.data, 0, 0]
        g._fn(*args, out.ctypes.data, n, scratch.ctypes.data, None, flags, None, None)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    want = a.astype(np.float64) @ b.astype(np.float64)
    bound = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    np.testing.assert_allclose(outs[1], want, rtol=0, atol=1e-5 * bound.max() + 1e-30)


def test_packed_products_take_the_tile_that_pads_fewer_rows(monkeypatch):
    monkeypatch.setattr(gemm_runtime, "WIDE", dict(AVX512_WIDE))
    monkeypatch.setattr(gemm_runtime, "SHORT", dict(AVX512_SHORT))
    monkeypatch.setattr(gemm_runtime, "_GEMMS", {})
    assert (padded_rows(16, AVX512_WIDE), padded_rows(16, AVX512_SHORT)) == (24, 16)
    for m, short in [(16, True), (8, True), (12, False), (24, False), (40, True), (64, True)]:
        g = packed_b_gemm(m)
        assert (g.spec.mr == AVX512_SHORT["mr"]) == short, m
        assert g.spec.nr == AVX512_WIDE["nr"]  # one packed B serves either tile


class _Slot:
    def __init__(self, shape):
        self.shape = shape


class _Plan:
    def __init__(self, shapes):
        self.slots = [_Slot(s) for s in shapes]


def _sgemm(m, n, k, b_slot, tb=NO_TRANS):
    ldb = k if tb == TRANS else n
    args = [101, NO_TRANS, tb, m, n, k, Ptr(0), k, Ptr(b_slot), ldb, Ptr(3), n]
    return Record(SGEMM, ("blas", "f32"), args)


def test_only_products_with_a_loop_invariant_weight_and_few_rows_are_rewritten():
    plan = _Plan([(16, 256), (256, 1024), (16, 256), (16, 1024), (1024, 256)])
    records = [
        _sgemm(16, 1024, 256, 1),  # h @ U, U a `with` slot: packed
        _sgemm(16, 256, 1024, 4, TRANS),  # dG @ W^T, W a `with` slot: packed (transposed)
        _sgemm(16, 256, 16, 2),  # B a carry: stays with OpenBLAS
        _sgemm(65, 1024, 256, 1),  # more than MAX_ROWS rows: stays
        _sgemm(16, 16, 16, 1),  # a small weight: stays
    ]
    lp, packs = packed_products.prepack(LoopPlan(records, 1, 0), plan, [1, 4])
    assert [r.kind for r in lp.records] == [CALL, CALL, SGEMM, SGEMM, SGEMM]
    assert [(p.slot, p.trans, p.k, p.n) for p in packs] == [
        (1, False, 256, 1024),
        (4, True, 1024, 256),
    ]
    assert lp.records[1].args[8] == ("packed", 1)
    assert lp.records[0].args[15] & B_PACKED
    off = packed_products.PREPACK
    try:
        packed_products.PREPACK = False
        same, none = packed_products.prepack(LoopPlan(records, 1, 0), plan, [1, 4])
    finally:
        packed_products.PREPACK = off
    assert none == [] and [r.kind for r in same.records] == [SGEMM] * 5


torch = pytest.importorskip("torch")


def _lstm_data(batch=4, inputs=8, hidden=256, steps=3):
    """benchmarks/rnn.py's LSTM at hidden 256 (its backward scan runs natively there; at 64 and
    below the cost model merges its products through a concatenation, on the Python driver)."""
    p = {}
    for g in "ifoc":
        p[f"w{g}"] = (RNG.standard_normal((inputs, hidden)) * 0.3).astype(np.float32)
        p[f"u{g}"] = (RNG.standard_normal((hidden, hidden)) * 0.1).astype(np.float32)
    h0 = (RNG.standard_normal((batch, hidden)) * 0.5).astype(np.float32)
    xs = RNG.standard_normal((steps, batch, inputs)).astype(np.float32)
    return p, h0, xs


def test_an_lstm_with_packed_weights_equals_float64_torch_and_openblas(monkeypatch):
    from tests.test_lstm_scan import _close, _torch_float64, loss

    p, h0, xs = _lstm_data()
    monkeypatch.setattr(packed_products, "PREPACK", False)
    plain_value, plain_grads = dq.jit(dq.value_and_grad(loss))(p, h0, xs)
    monkeypatch.setattr(packed_products, "PREPACK", True)
    packs = []
    real = native_loop.pack_withs

    def spy(pk, withs, bufs):
        packs.extend(pk)
        real(pk, withs, bufs)

    monkeypatch.setattr(native_loop, "pack_withs", spy)
    value, grads = dq.jit(dq.value_and_grad(loss))(p, h0, xs)
    # both scans read weights packed: U in the forward step, U^T in the adjoint step
    assert any(not pk.trans for pk in packs) and any(pk.trans for pk in packs), packs
    want_value, want_grads = _torch_float64(p, h0, xs)
    _close(value, want_value)
    _close(value, plain_value)
    i_value, i_grads = dq.jit(dq.value_and_grad(loss), target="interp")(p, h0, xs)
    _close(value, i_value)
    for k in p:
        _close(grads[k], want_grads[k])
        _close(grads[k], plain_grads[k])
        _close(grads[k], i_grads[k])
