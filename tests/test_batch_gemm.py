"""Batched products through our GEMM (codegen/runtime/batch_gemm.py, the native batch loop
cpu/gemm_batch_ir.py) against float64 numpy: drawn batch shapes with broadcast dimensions
(size 1, missing, stride 0), transposed operands read through their strides, both micro-tiles,
one to several threads; the layouts it declines; compiled programs whose batched matmuls it
runs, called from many Python threads at once, against the interpreter."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gemm import _check

import dlvm_eq as dq
from dlvm_eq.codegen.runtime import batch_gemm, gemm_runtime
from dlvm_eq.codegen.runtime.gemm_runtime import CpuGemm
from dlvm_eq.codegen.runtime.gemm_tiles import AVX2_TILE, AVX512_WIDE
from dlvm_eq.codegen.runtime.launch_pool import LaunchPool

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@contextlib.contextmanager
def gemm_with(tile, threads):
    """batch_matmul using CpuGemm(tile, threads) on every product (no size floor, even small
    batches split over the threads), with a fresh plan cache."""
    gemms = {}

    def shared(narrow):
        return gemms.setdefault(narrow, CpuGemm(narrow, threads=threads, tile=tile))

    with pytest.MonkeyPatch.context() as m:
        m.setattr(gemm_runtime, "shared_gemm", shared)
        m.setattr(gemm_runtime, "GEMM_MIN_MACS", 1)
        m.setattr(gemm_runtime, "PARALLEL_MACS", 1)
        m.setattr(gemm_runtime, "MIN_BLOCK_MACS", 1)
        m.setattr(batch_gemm, "_LAUNCHES", LaunchPool(64))
        yield


def _entry_check(out, a, b):
    """Every entry of out against its own float64 product (the summation bound of _check)."""
    batch = out.shape[:-2]
    wa = np.broadcast_to(a, batch + a.shape[-2:])
    wb = np.broadcast_to(b, batch + b.shape[-2:])
    for idx in np.ndindex(*batch):
        _check(out[idx], wa[idx], wb[idx])


def _matrices(rng, batch, rows, cols, transposed):
    """float32 (batch..., rows, cols): C-ordered, or a transposed view of a C-ordered array."""
    if transposed:
        return np.swapaxes(rng.standard_normal(batch + (cols, rows), dtype=np.float32), -1, -2)
    return rng.standard_normal(batch + (rows, cols), dtype=np.float32)


dims = st.one_of(
    st.integers(1, 20), st.sampled_from([5, 6, 7, 15, 16, 17, 33, 63, 64, 65, 129, 257])
)


@st.composite
def batch_shapes(draw):
    """(a's batch, b's batch): up to 3 dimensions, each side keeping a suffix, with 1s."""
    batch = draw(st.lists(st.integers(1, 4), max_size=3))

    def side():
        kept = batch[len(batch) - draw(st.integers(0, len(batch))) :]
        return tuple(1 if draw(st.booleans()) else d for d in kept)

    sa, sb = side(), side()
    if not sa and not sb:
        sa = (2,)
    return sa, sb


@settings(max_examples=40, **SETTINGS)
@given(
    shapes=batch_shapes(),
    m=dims,
    k=dims,
    n=dims,
    ta=st.booleans(),
    tb=st.booleans(),
    tile=st.sampled_from(["avx2", "avx512"]),
    threads=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 2**31),
)
def test_drawn_batched_products_against_float64(shapes, m, k, n, ta, tb, tile, threads, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes
    a = _matrices(rng, sa, m, k, ta)
    b = _matrices(rng, sb, k, n, tb)
    batch = np.broadcast_shapes(sa, sb)
    out = np.full(batch + (m, n), np.nan, np.float32)
    with gemm_with(AVX2_TILE if tile == "avx2" else AVX512_WIDE, threads):
        assert batch_gemm.batch_matmul(a, b, out)
    _entry_check(out, a, b)


@settings(max_examples=25, **SETTINGS)
@given(
    batch=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    m=dims,
    k=dims,
    n=dims,
    ta=st.booleans(),
    columns=st.booleans(),
    threads=st.sampled_from([1, 2, 3]),
    data=st.data(),
)
def test_results_written_in_a_readers_layout(batch, m, k, n, ta, columns, threads, data):
    """out a permuted view of a C-ordered buffer (a product written in the layout its reader
    wants, planning/product_layout.py): the batch axes and the entry's rows in any order of the
    buffer's axes, the entry's columns innermost (row-major entries) or its rows innermost
    (column-major entries, computed as outᵀ = bᵀ aᵀ); every element of the buffer written once."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    shape = tuple(batch) + (m, n)
    inner = len(shape) - 2 if columns else len(shape) - 1
    rest = data.draw(st.permutations([d for d in range(len(shape)) if d != inner]))
    order = list(rest) + [inner]  # buffer axis j holds out axis order[j]
    buf = np.full(tuple(shape[d] for d in order), np.nan, np.float32)
    out = buf.transpose(np.argsort(order))
    assert out.shape == shape
    a = _matrices(rng, tuple(batch), m, k, ta)
    b = _matrices(rng, tuple(batch), k, n, False)
    with gemm_with(AVX2_TILE, threads):
        assert batch_gemm.batch_matmul(a, b, out)
    assert not np.isnan(buf).any()
    _entry_check(out, a, b)


def test_stride_zero_operands_and_a_batch_of_one():
    """np.broadcast_to operands (stride 0 in the batch dimensions), a batch of one entry."""
    with gemm_with(AVX2_TILE, 2):
        rng = np.random.default_rng(1)
        a = np.broadcast_to(rng.standard_normal((1, 37, 29), dtype=np.float32), (5, 37, 29))
        b = rng.standard_normal((5, 29, 41), dtype=np.float32)
        out = np.empty((5, 37, 41), np.float32)
        assert batch_gemm.batch_matmul(a, b, out)
        _entry_check(out, a, b)
        one = np.empty((1, 37, 41), np.float32)
        assert batch_gemm.batch_matmul(a[:1], b[:1], one)
        _entry_check(one, a[:1], b[:1])
        # the same layouts again: the kept plan, new data
        b2 = rng.standard_normal((5, 29, 41), dtype=np.float32)
        assert batch_gemm.batch_matmul(a, b2, out)
        _entry_check(out, a, b2)


def test_empty_batches_and_zero_depth():
    with gemm_with(AVX2_TILE, 2):
        f32 = np.float32
        assert batch_gemm.batch_matmul(
            np.ones((0, 3, 4), f32), np.ones((0, 4, 5), f32), np.empty((0, 3, 5), f32)
        )
        out = np.full((2, 3, 5), np.nan, f32)
        assert batch_gemm.batch_matmul(np.ones((2, 3, 0), f32), np.ones((2, 0, 5), f32), out)
        assert (out == 0).all()


def test_declined_layouts_are_left_to_numpy():
    """False and out untouched: float64, an out entry with no unit stride, an A with no contiguous
    direction, shapes that do not broadcast, a rank-2 result."""
    with gemm_with(AVX2_TILE, 2):
        rng = np.random.default_rng(2)
        a = rng.standard_normal((3, 8, 6), dtype=np.float32)
        b = rng.standard_normal((3, 6, 5), dtype=np.float32)
        out = np.full((3, 8, 5), np.nan, np.float32)
        assert not batch_gemm.batch_matmul(
            a.astype(np.float64), b.astype(np.float64), out.astype(np.float64)
        )
        assert not batch_gemm.batch_matmul(
            a, b, np.full((3, 8, 10), np.nan, np.float32)[:, :, ::2]
        )  # no unit stride along the rows or the columns of an entry
        assert not batch_gemm.batch_matmul(
            a, b, np.lib.stride_tricks.as_strided(out[:1], out.shape, (0, *out.strides[1:]))
        )  # every entry the same memory
        assert not batch_gemm.batch_matmul(
            a[:, ::2, ::2], b[:, :3], np.empty((3, 4, 5), np.float32)
        )
        assert not batch_gemm.batch_matmul(a, rng.standard_normal((2, 6, 5), dtype=np.float32), out)
        assert not batch_gemm.batch_matmul(a[0], b[0], out[0])
        assert np.isnan(out).all()


def test_entries_are_split_over_threads_or_each_product_is():
    """Enough entries: ranges of entries, all covered once; fewer entries than threads: each
    product's blocks (CpuGemm.blocks)."""
    g = CpuGemm(threads=2, tile=AVX2_TILE)
    parts = batch_gemm._parts(g, 64, 128, 128, 64, a_packed=False)
    assert len(parts) == 2 * gemm_runtime.BLOCKS_PER_THREAD
    assert [p[:2] for p in parts] == [(i * 8, i * 8 + 8) for i in range(8)]
    assert all(p[2:] == (0, 128, 0, 128) for p in parts)
    one = batch_gemm._parts(g, 1, 512, 512, 512, a_packed=False)
    assert {p[:2] for p in one} == {(0, 1)} and len(one) == len(g.blocks(512, 512, 512))


def _attention(q, k, v):
    """softmax-free attention: (q @ k^T) @ v, two batched products, one with a transposed operand."""
    return (q @ dq.transpose(k, (0, 1, 3, 2))) @ v


def test_compiled_batched_matmuls_run_through_it_from_many_threads(monkeypatch):
    """A program with two batched products (one of them on a transposed operand) runs them
    through batch_matmul (counted), from eight Python threads at once with different
    operands, each result against the interpreter's."""
    calls = []
    real = batch_gemm.batch_matmul
    monkeypatch.setattr(
        batch_gemm, "batch_matmul", lambda a, b, out: calls.append(out.shape) or real(a, b, out)
    )
    rng = np.random.default_rng(3)
    shape = (2, 4, 64, 32)
    f = dq.jit(_attention)
    ref = dq.jit(_attention, target="interp")
    cases = []
    for _ in range(8):
        args = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
        cases.append((args, ref(*[x.astype(np.float64) for x in args])))
    f(*cases[0][0])
    assert calls and all(s[:2] == (2, 4) for s in calls)
    bad = []

    def work(args, want):
        for _ in range(10):
            got = f(*args)
            if not np.allclose(got, want, rtol=1e-4, atol=1e-3):
                bad.append(float(np.abs(got - want).max()))

    threads = [threading.Thread(target=work, args=c) for c in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not bad


def test_concurrent_callers_get_plans_of_their_own():
    """A plan being run is not handed out again (a second caller of the same layouts makes
    its own instead of waiting on a lock); given back, it is reused; at most `limit` idle."""
    pool = LaunchPool(2)
    made = []

    def make():
        made.append(object())
        return made[-1]

    first, second = pool.take("k", make), pool.take("k", make)
    assert first is not second and len(made) == 2
    pool.give("k", first)
    assert pool.take("k", make) is first and len(made) == 2
    for key in ("k", "j", "i"):
        pool.give(key, make())
    assert len(pool.idle()) <= 2
