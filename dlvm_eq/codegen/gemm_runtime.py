"""Run our float32 GEMM (`gemm.py`) on numpy arrays: `CpuGemm(order)(a, b, out)` splits C into
one block per thread and runs the blocks on the native worker pool.

    >>> g = gemm_for(a, b, out)        # a CpuGemm, or None when numpy's BLAS should do it
    >>> g(a, b, out)                   # out = a @ b

`gemm_for` says when ours is used: float32 2-D operands, A's columns or rows contiguous (a
plain or transposed operand), any B, C-contiguous out, and at least GEMM_MIN_MACS of work;
otherwise the caller keeps numpy's matmul. Products of PARALLEL_MACS or more run on all cores.

Why every sizeable matmul of a program goes through ours, small ones included: OpenBLAS's
worker threads busy-wait ~100 ms after each threaded call (measured: 100 ms of CPU in the
0.5 s after one 256x784x256 product), so one BLAS call in a step leaves a spinning thread
that competes with our own workers for the second core; an MLP step mixing the two ran at
2.8 ms instead of 1.4. The compiled function is cached like every kernel (memory and disk,
keyed by its spec and the host).
"""
from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable

import numpy as np

from .cpu_runtime import _JIT, KernelCode, data_ptr, usable_cpus

# Products smaller than this many multiply-adds stay with numpy (OpenBLAS runs those on one
# thread; a call through ours costs a few microseconds of set-up).
GEMM_MIN_MACS = 1 << 16
# From this many multiply-adds a product is split over the cores (below, waking a worker and
# packing B twice cost more than the second core gives).
PARALLEL_MACS = 1 << 21
MAX_LAUNCHES = 64           # launch plans kept per GEMM (one per operand shape and strides)
ENABLED = os.environ.get("DLVM_EQ_GEMM", "1") != "0"

_ARGS = [ctypes.c_int64] * 5 + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]


# Micro-tiles: 12 x 32 (24 accumulators, two B vectors per k) in general; 24 x 16 for products
# at most 16 columns wide (the MLP's 10 classes would leave 22 of 32 columns idle).
WIDE = dict(mr=12, nr=32, kc=256, mc=144)
NARROW = dict(mr=24, nr=16, kc=256, mc=144)


def _spec(a_order: str, b_order: str, narrow: bool = False, epilogue=None, epilogue_c: int = 0):
    from .gemm import GemmSpec
    return GemmSpec(a_order, b_order, **(NARROW if narrow else WIDE), epilogue=epilogue,
                    epilogue_c=epilogue_c)


class CpuGemm:
    """out = a @ b for float32 matrices, A read as `a_order` ("rows" or "cols"), B as
    `b_order` ("rows": columns contiguous, or "any"); with `epilogue` (a KernelSpec over out's
    shape whose input `epilogue_c` is out), that kernel runs on each finished tile: call with
    `extra` = the kernel's output pointers then its input pointers."""

    def __init__(self, a_order: str, b_order: str = "rows", threads: int | None = None,
                 narrow: bool = False, epilogue=None, epilogue_c: int = 0):
        self.spec = _spec(a_order, b_order, narrow, epilogue, epilogue_c)
        self.order = a_order
        self.threads = threads or usable_cpus()
        self.code: KernelCode = _JIT.kernel("gemm", self.spec, self._build_ir)
        self.address = self.code.address
        n_extra = len(epilogue.outputs) + len(epilogue.inputs) if epilogue is not None else 0
        self._fn = ctypes.CFUNCTYPE(None, *_ARGS, *[ctypes.c_void_p] * n_extra)(self.address)
        self._launches: dict[tuple, Callable] = {}
        self._lock = threading.Lock()

    def _build_ir(self):
        from .gemm import gemm_ir
        from .llvm_cpu import CpuIR, symbol_for
        text, symbol = symbol_for(lambda sym: gemm_ir(self.spec, sym))
        return CpuIR(text, symbol, None, "gemm")

    def blocks(self, m: int, n: int, k: int) -> list[tuple[int, int, int, int]]:
        """(m0, m1, n0, n1) per thread: rows split in whole micro-tiles, else columns."""
        s, t = self.spec, self.threads
        if m * n * k < PARALLEL_MACS:
            t = 1
        if t > 1 and m >= 2 * t * s.mr:
            step = -(-(-(-m // t)) // s.mr) * s.mr
            return [(lo, min(lo + step, m), 0, n) for lo in range(0, m, step)]
        if t > 1 and n >= 2 * t * s.nr:
            step = -(-(-(-n // t)) // s.nr) * s.nr
            return [(0, m, lo, min(lo + step, n)) for lo in range(0, n, step)]
        return [(0, m, 0, n)]

    def __call__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool = False,
                 extra: tuple = ()):
        m, k = a.shape
        n = b.shape[1]
        if m == 0 or n == 0:
            return out
        if k == 0:
            if self.spec.epilogue is not None:
                raise ValueError("a GEMM with an epilogue needs k >= 1 (the caller runs k = 0 unfused)")
            if not accumulate:
                out.fill(0)
            return out
        key = (a.shape, a.strides, b.shape, b.strides, out.strides, accumulate)
        with self._lock:            # the launch's scratch and argument blocks are shared
            launch = self._launches.get(key)
            if launch is None:
                if len(self._launches) >= MAX_LAUNCHES:
                    self._launches.clear()
                launch = self._launches[key] = self._launch(a, b, out, accumulate)
            launch(data_ptr(a), data_ptr(b), data_ptr(out), extra)
        return out

    def _launch(self, a, b, out, accumulate: bool):
        """A function of the three data pointers that runs the product for these shapes and
        strides: its blocks, scratch and argument lists are made once (a call then costs a few
        stores, not ~10 us of Python)."""
        m, k = a.shape
        n = b.shape[1]
        parts = self.blocks(m, n, k)
        scratch = [tuple(np.empty(size, np.float32) for size in self.spec.scratch(n1 - n0))
                   for _, _, n0, n1 in parts]
        rows = [[m0, m1, n0, n1, k, 0, a.strides[0] // 4, a.strides[1] // 4, 0, b.strides[0] // 4,
                 b.strides[1] // 4, 0, out.strides[0] // 4, data_ptr(pa), data_ptr(pb), int(accumulate)]
                for (m0, m1, n0, n1), (pa, pb) in zip(parts, scratch)]
        fn = self._fn
        n_extra = len(self.spec.epilogue.outputs) + len(self.spec.epilogue.inputs) if self.spec.epilogue else 0
        for r in rows:
            r.extend([0] * n_extra)
        if len(rows) == 1:
            args = rows[0]

            def run(pa, pb, po, extra):
                args[5], args[8], args[11] = pa, pb, po
                args[16:] = extra
                fn(*args)
            run.scratch = scratch
            return run
        from .cpu_runtime import _native, _run_chunks
        pool = _native()
        if pool is None:
            def run(pa, pb, po, extra):
                for r in rows:
                    r[5], r[8], r[11] = pa, pb, po
                    r[16:] = extra
                _run_chunks(fn, [tuple(r) for r in rows], self.threads)
            run.scratch = scratch
            return run
        blocks = np.zeros((len(rows), pool.max_args), np.int64)
        blocks[:, :len(rows[0])] = rows
        address, threads = self.address, self.threads

        def run(pa, pb, po, extra):
            blocks[:, 5], blocks[:, 8], blocks[:, 11] = pa, pb, po
            if n_extra:
                blocks[:, 16:16 + n_extra] = extra
            pool.run_blocks(address, blocks, threads)
        run.scratch = scratch
        return run


_GEMMS: dict[tuple, CpuGemm] = {}


def a_order(a: np.ndarray) -> str | None:
    """How the GEMM can read A: "rows" (columns contiguous), "cols" (rows contiguous), None."""
    if a.strides[1] == 4 and a.strides[0] >= 4 * a.shape[1]:
        return "rows"
    if a.strides[0] == 4 and a.strides[1] >= 4 * a.shape[0]:
        return "cols"
    return None


def gemm_for(a: np.ndarray, b: np.ndarray, out: np.ndarray, epilogue=None, epilogue_c: int = 0) -> CpuGemm | None:
    """Our GEMM for out = a @ b (then `epilogue`, see CpuGemm), or None where numpy's matmul
    is the better or only choice (the caller then runs the epilogue kernel after it)."""
    if not ENABLED or a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
        return None
    if not (a.dtype == b.dtype == out.dtype == np.float32):
        return None
    m, k = a.shape
    n = b.shape[1]
    if m * n * k < GEMM_MIN_MACS or (epilogue is not None and k == 0):
        return None
    order = a_order(a)
    if order is None or not out.flags.c_contiguous or b.strides[0] % 4 or b.strides[1] % 4:
        return None
    narrow = n <= NARROW["nr"]
    if order == "rows" and not narrow and _rows_collide(a.strides[0] // 4, WIDE["mr"]):
        order = "rows_packed"
    key = (order, "rows" if b.strides[1] == 4 else "any", narrow, epilogue, epilogue_c)
    g = _GEMMS.get(key)
    if g is None:
        g = _GEMMS[key] = CpuGemm(key[0], key[1], narrow=key[2], epilogue=epilogue, epilogue_c=epilogue_c)
    return g


def _rows_collide(row_stride: int, rows: int) -> bool:
    """Whether `rows` rows `row_stride` floats apart fall into fewer than `rows` of the L1's
    64 sets (64-byte lines): read in place they would evict each other (and the packed B)
    while a micro-tile runs. Packing A (a transposing copy) is cheaper then."""
    return len({(i * row_stride * 4 // 64) % 64 for i in range(rows)}) < rows


_swap_scratch: dict[tuple[int, int], np.ndarray] = {}


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """out = a @ b through our GEMM; False (nothing done) where numpy should do it.

    A narrow product with a transposed A (e.g. h.T @ dz with 10 columns: A would be packed in
    full for a 10-column result) is computed the other way round, out.T = b.T @ a.T, into a
    scratch matrix that is then copied: B's packing reads h as it lies."""
    n = b.shape[1] if b.ndim == 2 else 0
    if (n <= NARROW["nr"] and a.ndim == 2 and a.shape[0] >= 2 * NARROW["nr"] and a_order(a) == "cols"
            and b.ndim == 2 and a_order(b.T) is not None):
        t = _swap_scratch.get(out.shape)
        if t is None:
            t = _swap_scratch[out.shape] = np.empty(out.shape[::-1], np.float32)
        g = gemm_for(b.T, a.T, t)
        if g is not None:
            g(b.T, a.T, t)
            np.copyto(out, t.T)
            return True
    g = gemm_for(a, b, out)
    if g is None:
        return False
    g(a, b, out)
    return True
