"""Batched float32 matmul through our GEMM (issue 14): out = a @ b with numpy's rules for the
batch dimensions (broadcast, size 1, stride 0), each entry's matrices read through their
strides (a transposed operand as it lies), the loop over the entries in native code
(cpu/gemm_batch_ir.py) and the entries split over the native pool's threads. No operand is
copied beyond the GEMM's own packing.

    >>> batch_matmul(a, b, out)      # True: done; False: nothing done, the caller runs numpy

Why: numpy's matmul loops over the batch calling BLAS on each small matrix; the transformer's
attention products (64 entries of 128 x 64 x 128) ran at ~45 GFLOP/s that way.

Work split (`_parts`): with at least as many entries as threads, each part is a range of
entries (up to BLOCKS_PER_THREAD parts per thread, claimed one at a time as in CpuGemm);
with fewer, each entry's product is split as a 2-D one (CpuGemm.blocks). Every element sums
its K products in one order on any thread count.

Shared state (threads): `_LAUNCHES` (a LaunchPool) hands each call a plan of its own (scratch,
offsets, argument blocks); `_DRIVER` (the compiled batch loop) is made under `_DRIVER_LOCK`.
"""

from __future__ import annotations

import ctypes
import math
import threading

import numpy as np

from . import (
    gemm_runtime as gemm,
)  # by module: its thresholds are read at each use (tests set them)
from . import threads as kernel_threads  # by module: tests swap native_workers
from .buffers import data_ptr
from .gemm_runtime import GEMM_CTYPES, MAX_LAUNCHES, NARROW, CpuGemm, a_order, split_tiles
from .jit import JIT
from .launch_pool import LaunchPool

_LAUNCHES = LaunchPool(MAX_LAUNCHES)
_DRIVER_ARGS = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p] + GEMM_CTYPES
_A, _B, _C = 4 + 5, 4 + 8, 4 + 11  # the driver's arguments holding the operands' pointers
_DRIVER = None
_DRIVER_LOCK = threading.Lock()


def use_blocks(blocks: dict | None) -> None:
    """gemm_runtime.use_blocks, and this module's launch plans (made for the old kernels) dropped."""
    global _LAUNCHES
    if gemm.use_blocks(blocks):
        _LAUNCHES = LaunchPool(MAX_LAUNCHES)


def worth_batched(out_shape: tuple, k: int) -> bool:
    """Whether a batched product of this result shape (batch..., m, n) and depth is one for
    our GEMM: it is enabled and all entries together reach GEMM_MIN_MACS (entries are never
    run one Python call each, so small ones add up)."""
    return len(out_shape) >= 3 and math.prod(out_shape) * k >= gemm.GEMM_MIN_MACS and gemm.enabled()


def batch_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """out = a @ b for float32 operands of rank >= 2 with broadcast batch dimensions and an
    `out` of rank >= 3 whose entries have a unit stride along their rows or columns (any batch
    strides: a result written in its reader's layout); False (nothing done) where numpy should
    do it (another dtype or rank, an entry whose A has no contiguous direction, too little
    work)."""
    if (
        a.ndim < 2
        or b.ndim < 2
        or out.ndim < 3
        or not (a.dtype == b.dtype == out.dtype == np.float32)
    ):
        return False
    if out.strides[-1] != out.itemsize and out.shape[-1] > 1 and out.size:
        if out.strides[-2] == out.itemsize or out.shape[-2] == 1:
            # column-major entries (a result written in its reader's layout): outᵀ = bᵀ aᵀ
            a, b, out = (np.swapaxes(x, -1, -2) for x in (b, a, out))
    key = (a.shape, a.strides, b.shape, b.strides, out.shape, out.strides)
    launch = _LAUNCHES.take(key, lambda: _plan(a, b, out))
    try:
        if launch is not None:
            launch(data_ptr(a), data_ptr(b), data_ptr(out))
    finally:
        _LAUNCHES.give(key, launch)  # None too: the answer for these layouts is kept
    return launch is not None


def _plan(a, b, out):
    """A function of the data pointers running out = a @ b for these shapes and strides, or None."""
    m, k = a.shape[-2:]
    n = b.shape[-1]
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return None
    if b.shape[-2] != k or out.shape != batch + (m, n):
        return None
    if out.strides[-1] != out.itemsize and n > 1 and out.size:  # entries of neither order
        return None
    if out.size and any(s == 0 and d > 1 for s, d in zip(out.strides, out.shape)):  # aliased
        return None
    count = math.prod(batch)
    if count == 0 or m == 0 or n == 0:
        return lambda pa, pb, po: None
    if k == 0:
        return lambda pa, pb, po: _zero(po, out.size)
    if not worth_batched(out.shape, k):
        return None
    whole_a = np.broadcast_to(a, batch + (m, k))  # views: stride 0 on broadcast dimensions
    whole_b = np.broadcast_to(b, batch + (k, n))
    first = (0,) * len(batch)
    a2, b2 = _entry(whole_a[first]), _entry(whole_b[first])
    strides = whole_a.strides + whole_b.strides + out.strides
    if a_order(a2) is None or any(s % 4 or s < 0 for s in strides):
        return None
    g = gemm.shared_gemm(n <= NARROW["nr"])
    return _launch(g, a2, b2, whole_a, whole_b, out, batch)


def _entry(x: np.ndarray) -> np.ndarray:
    """One entry's matrix with a size-1 dimension given the stride that a C-ordered (or, if
    the other dimension is the contiguous one, F-ordered) matrix would have: np.broadcast_to
    gives it stride 0, and the GEMM's choice of layout (a_order, B_STRIDED) reads strides."""
    (r, c), (rs, cs) = x.shape, x.strides
    if c == 1:
        cs = 4 if rs != 4 else 4 * r
    if r == 1:
        rs = 4 if cs != 4 else 4 * c
    return np.lib.stride_tricks.as_strided(x, (r, c), (rs, cs))


def _zero(po: int, size: int) -> None:
    ctypes.memset(po, 0, 4 * size)  # k = 0: every entry of out is an empty sum


def _offsets(batch: tuple, strides: tuple) -> np.ndarray:
    """Element offsets of every batch entry (C order) for these batch strides in bytes."""
    off = np.zeros(batch, np.int64)
    for d, (size, s) in enumerate(zip(batch, strides)):
        shape = [1] * len(batch)
        shape[d] = size
        off += (np.arange(size, dtype=np.int64) * (s // 4)).reshape(shape)
    return off.reshape(-1)


def _parts(g: CpuGemm, count: int, m: int, n: int, k: int, a_packed: bool) -> list[tuple]:
    """(b0, b1, m0, m1, n0, n1) pieces of the work (see the module docstring)."""
    t, macs = g.threads, count * m * n * k
    if t == 1 or macs < gemm.PARALLEL_MACS:
        return [(0, count, 0, m, 0, n)]
    if count >= t:
        want = max(t, min(gemm.BLOCKS_PER_THREAD * t, macs // gemm.MIN_BLOCK_MACS, count))
        return [(lo, hi, 0, m, 0, n) for lo, hi in split_tiles(count, want, 1)]
    return [(i, i + 1, *blk) for i in range(count) for blk in g.blocks(m, n, k, a_packed)]


def _launch(g: CpuGemm, a2, b2, whole_a, whole_b, out, batch):
    from ..cpu.gemm_ir import A_COLS, A_ROWS_PACKED

    m, k = a2.shape
    n = b2.shape[1]
    nb = len(batch)
    count = math.prod(batch)
    offsets = np.ascontiguousarray(
        np.stack(
            [
                _offsets(batch, whole_a.strides[:nb]),
                _offsets(batch, whole_b.strides[:nb]),
                _offsets(batch, out.strides[:nb]),
            ],
            axis=1,
        )
    )
    flags = g.flags(a2, b2)
    parts = _parts(g, count, m, n, k, a_packed=bool(flags & (A_COLS | A_ROWS_PACKED)))
    scratch = [
        tuple(np.empty(size, np.float32) for size in g.spec.scratch(n1 - n0))
        for *_, n0, n1 in parts
    ]
    no_epilogue_args = np.zeros(1, np.int64)
    rows = [
        [
            b0,
            b1,
            data_ptr(offsets),
            g.address,
            m0,
            m1,
            n0,
            n1,
            k,
            0,
            a2.strides[0] // 4,
            a2.strides[1] // 4,
            0,
            b2.strides[0] // 4,
            b2.strides[1] // 4,
            0,
            out.strides[-2] // 4,
            data_ptr(pa),
            data_ptr(pb),
            flags,
            0,
            data_ptr(no_epilogue_args),
        ]
        for (b0, b1, m0, m1, n0, n1), (pa, pb) in zip(parts, scratch)
    ]
    driver = _driver()
    fn = ctypes.CFUNCTYPE(None, *_DRIVER_ARGS)(driver.address)
    pool = kernel_threads.native_workers()
    if len(rows) == 1:
        args = rows[0]

        def run(pa, pb, po):
            args[_A], args[_B], args[_C] = pa, pb, po
            fn(*args)
    elif pool is None:

        def run(pa, pb, po):
            for r in rows:
                r[_A], r[_B], r[_C] = pa, pb, po
            kernel_threads.run_chunks(fn, [tuple(r) for r in rows], g.threads)
    else:
        blocks = np.zeros((len(rows), pool.max_args), np.int64)
        blocks[:, : len(rows[0])] = rows
        address, threads = driver.address, g.threads

        def run(pa, pb, po):
            blocks[:, _A], blocks[:, _B], blocks[:, _C] = pa, pb, po
            pool.run_blocks(address, blocks, threads)

    # the arrays the native code reads by address live as long as the plan
    run.keep = (offsets, scratch, no_epilogue_args, fn)
    run.parts = parts
    return run


def _driver():
    """The compiled batch loop (one for the process: it calls the GEMM by address)."""
    global _DRIVER
    with _DRIVER_LOCK:
        if _DRIVER is None:
            _DRIVER = JIT.kernel("gemm_batch", "gemm_batch", _build_driver)
        return _DRIVER


def _build_driver():
    from ..cpu.gemm_batch_ir import gemm_batch_ir
    from ..cpu.llvm_cpu import CpuIR, symbol_for

    text, symbol = symbol_for(gemm_batch_ir)
    return CpuIR(text, symbol, None, "gemm_batch")
