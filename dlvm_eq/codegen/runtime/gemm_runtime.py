"""Run our float32 GEMM (`cpu/gemm_ir.py`) on numpy arrays: `CpuGemm()(a, b, out)` splits C into a
few blocks per thread (`CpuGemm.blocks`) that the native worker pool's threads claim.

    >>> g = gemm_for(a, b, out)        # a CpuGemm, or None when numpy's BLAS should do it
    >>> g(a, b, out)                   # out = a @ b
    >>> g(a, b, out, epilogue=CpuEpilogue(spec, c_input), extra=pointers)   # then spec per tile

`gemm_for` says when ours is used: float32 2-D operands, A's columns or rows contiguous (a
plain or transposed operand), any B, C-contiguous out, and at least GEMM_MIN_MACS of work;
otherwise the caller keeps numpy's matmul. Products of PARALLEL_MACS or more run on all cores.
There are two compiled GEMMs per host (gemm_tiles.py: on AVX-512 a 12x32 and, for products at
most 16 wide, a 24x16 micro-tile; on AVX2 one 6x16 tile for both);
operand layouts are run-time flags, epilogues separate small functions called through a
pointer, so a program's products share them (and so do programs: they are cached on disk).

Why every sizeable matmul of a program goes through ours, small ones included: OpenBLAS's
worker threads busy-wait ~100 ms after each threaded call (measured: 100 ms of CPU in the
0.5 s after one 256x784x256 product), so one BLAS call in a step leaves a spinning thread
that competes with our own workers for the second core (in the mlp_step benchmark a step that
mixed the two took 2.8 ms instead of 1.4).

Shared state (threads):
- `_GEMMS` (one CpuGemm per micro-tile shape) is filled under `_GEMMS_LOCK`;
- a CpuGemm's launch plans hold scratch (packed A and B) and argument blocks: each is run by
  one call at a time, taken from and given back to `CpuGemm._launches` (a LaunchPool, whose
  lock covers the lookup only), so concurrent products run at once, each on its own plan;
- the swapped path's scratch matrix is per thread (`_swap`, a threading.local): the copy out
  of it runs after the product, when the product's plan is already back in the pool;
- CpuEpilogue is immutable. Results do not depend on the thread count: threads take blocks of
  C's rows or columns, K is never split, and every element sums its K products in one order.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ...config import settings
from . import threads as kernel_threads  # by module: tests swap native_workers
from .buffers import data_ptr
from .cpu_count import usable_cpus
from .gemm_tiles import host_tiles, packs_row_major_a, padded_rows, short_tile, with_blocks
from .jit import JIT, KernelCode, host_features
from .launch_pool import LaunchPool

# Products of at most this many multiply-adds stay with numpy: OpenBLAS runs them on one
# thread (its threading threshold is 65536 x 4 multiply-adds, interface/gemm.c), so no worker
# of its is left spinning, and it is faster there (128x128x10: 5 us against our 10; a call
# through ours costs a few microseconds of set-up). Above it, ours (128x64x128: 18 us against
# OpenBLAS's 34, which wakes its second thread).
GEMM_MIN_MACS = (1 << 18) + 1
# From this many multiply-adds a product is split over the cores. Alone, a 256x256x10 product
# (655k) is faster on one core (25 us vs 36: waking a worker, packing B twice); inside the MLP
# step, whose operands the two cores have just written half each, splitting it measured ~5%
# faster per step (medians of 4 runs each: 1.11 vs 1.17 ms).
PARALLEL_MACS = 1 << 19
# Blocks per thread (see CpuGemm.blocks), each of at least MIN_BLOCK_MACS multiply-adds.
BLOCKS_PER_THREAD = 4
MIN_BLOCK_MACS = 1 << 17
MAX_LAUNCHES = 64  # launch plans kept per GEMM (one per operand shape and strides)

# Micro-tiles for the host's vector ISA (gemm_tiles.py): on AVX-512 12 x 32 in general and
# 24 x 16 for products at most 16 columns wide (the MLP's 10 classes would leave 22 of 32
# columns idle); on AVX2 6 x 16 for both.
# Copies, changed in place by `use_blocks` (batch_gemm reads NARROW by name). SHORT: products
# of few rows on a pre-packed B (`packed_b_gemm`).
HOST_WIDE, HOST_NARROW = host_tiles(host_features())
HOST_SHORT = short_tile(host_features())
WIDE, NARROW, SHORT = dict(HOST_WIDE), dict(HOST_NARROW), dict(HOST_SHORT)

GEMM_CTYPES = (
    [ctypes.c_int64] * 5
    + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] * 2
    + [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
)
_A, _B, _C, _EPI_ARGS = 5, 8, 11, 17  # argument positions of the per-call pointers


class CpuEpilogue:
    """An elementwise kernel over a product's (M, N) space, compiled to run on its tiles
    (`gemm.epilogue_ir`); `c_input` is the kernel input that reads the product."""

    def __init__(self, spec, c_input: int):
        from ..cpu.gemm_ir import check_epilogue

        check_epilogue(spec, c_input)
        self.spec, self.c_input = spec, c_input
        self.n_pointers = len(spec.outputs) + len(spec.inputs)
        self.code: KernelCode = JIT.kernel("epilogue", spec, self._build_ir)
        self.address = self.code.address

    def _build_ir(self):
        from ..cpu.gemm_ir import epilogue_ir
        from ..cpu.llvm_cpu import CpuIR, symbol_for

        text, symbol = symbol_for(lambda sym: epilogue_ir(self.spec, sym, WIDE["nr"]))
        return CpuIR(text, symbol, None, "epilogue")


class CpuGemm:
    """out (+)= a @ b for float32 matrices (a's rows or columns contiguous, any b, out
    C-contiguous); with `epilogue`, that kernel then runs on each finished tile, `extra` being
    its output pointers then its input pointers (the product's among them). `tile` (GemmSpec
    fields) overrides the host's (tests run the AVX2 and AVX-512 tiles on any host)."""

    def __init__(
        self,
        narrow: bool = False,
        threads: int | None = None,
        pack_rows: bool | None = None,
        tile: dict | None = None,
    ):
        from ..cpu.gemm_ir import GemmSpec

        self.tile = tile or (NARROW if narrow else WIDE)
        self.spec = GemmSpec(**self.tile)
        self.narrow = narrow
        self.pack_rows = pack_rows  # pack a row-major A: None = where its rows collide in L1
        self.threads = threads or usable_cpus()
        self.code: KernelCode = JIT.kernel("gemm", self.spec, self._build_ir)
        self.address = self.code.address
        self._fn = ctypes.CFUNCTYPE(None, *GEMM_CTYPES)(self.address)
        self._launches = LaunchPool(MAX_LAUNCHES)

    def _build_ir(self):
        from ..cpu.gemm_ir import gemm_ir
        from ..cpu.llvm_cpu import CpuIR, symbol_for

        text, symbol = symbol_for(lambda sym: gemm_ir(self.spec, sym))
        return CpuIR(text, symbol, None, "gemm")

    def blocks(
        self, m: int, n: int, k: int, a_packed: bool = False
    ) -> list[tuple[int, int, int, int]]:
        """(m0, m1, n0, n1) blocks of C, up to BLOCKS_PER_THREAD per thread, claimed one at a
        time by the pool's threads: a helper that the OS deschedules holding one holds up a
        small part of the product, and the caller takes the rest. Columns are split (whole
        NR panels) when A is read in place: each block then packs only its own columns of B,
        so nothing is packed twice (measured serially, 256x784x256 in 8 column blocks cost
        what 2 row blocks do). A packed A would be packed again by every column block, and B
        by every row block: the longer side is split (p blocks pack p*m*k + k*n elements split
        by columns, p*k*n + m*k by rows; 784x256x256: 8 row blocks +4%; the transformer's
        weight gradient X.T @ dY, 256x2048x1024, packed B 8 times split by rows)."""
        s, t = self.spec, self.threads
        macs = m * n * k
        if t == 1 or macs < PARALLEL_MACS:
            return [(0, m, 0, n)]
        want = max(t, min(BLOCKS_PER_THREAD * t, macs // MIN_BLOCK_MACS))
        row_tiles, col_tiles = -(-m // s.mr), -(-n // s.nr)
        by_cols = col_tiles >= 2 and (
            row_tiles < 2 or ((not a_packed or n > m) and col_tiles >= min(want, row_tiles))
        )
        if by_cols:
            cols = split_tiles(n, min(want, col_tiles), s.nr)
            # more blocks wanted than column panels: rows too (B is then packed once per row band)
            bands = split_tiles(m, max(1, min(want // len(cols), row_tiles)), s.mr)
            return [(r0, r1, c0, c1) for r0, r1 in bands for c0, c1 in cols]
        if row_tiles >= 2:
            return [(lo, hi, 0, n) for lo, hi in split_tiles(m, min(want, row_tiles), s.mr)]
        return [(0, m, 0, n)]

    def flags(self, a: np.ndarray, b: np.ndarray, accumulate: bool = False) -> int:
        """The run-time layout flags for these operands (gemm.A_COLS, ...)."""
        order = a_order(a)
        if order is None:
            raise ValueError("A needs a contiguous row or column direction (see a_order)")
        return self.layout_flags(order, a.strides[0] // 4, b.strides[1] != 4, accumulate)

    def layout_flags(
        self, a_order: str, a_row_stride: int, b_strided: bool, accumulate: bool = False
    ) -> int:
        """The flags for an A read by "rows" or "cols" (see a_order) with this row stride in
        elements, and a B whose columns are (not) contiguous."""
        from ..cpu.gemm_ir import A_COLS, A_ROWS_PACKED, ACCUMULATE, B_STRIDED

        f = A_COLS if a_order == "cols" else 0
        pack = self.pack_rows
        if pack is None:
            pack = (
                not self.narrow
                and packs_row_major_a(self.tile)
                and _rows_collide(a_row_stride, self.spec.mr)
            )
        if a_order == "rows" and pack:
            f |= A_ROWS_PACKED
        if b_strided:
            f |= B_STRIDED
        return f | (ACCUMULATE if accumulate else 0)

    def __call__(
        self,
        a: np.ndarray,
        b: np.ndarray,
        out: np.ndarray,
        accumulate: bool = False,
        epilogue: CpuEpilogue | None = None,
        extra=(),
    ):
        m, k = a.shape
        n = b.shape[1]
        if m == 0 or n == 0:
            return out
        if k == 0:
            if epilogue is not None:
                raise ValueError(
                    "a GEMM with an epilogue needs k >= 1 (the caller runs k = 0 unfused)"
                )
            if not accumulate:
                out.fill(0)
            return out
        key = (
            a.shape,
            a.strides,
            b.shape,
            b.strides,
            out.strides,
            accumulate,
            epilogue.address if epilogue is not None else 0,
        )
        # a plan of this call's own: its scratch and argument blocks are written by the run
        launch = self._launches.take(key, lambda: self._launch(a, b, out, accumulate, epilogue))
        try:
            launch(data_ptr(a), data_ptr(b), data_ptr(out), extra)
        finally:
            self._launches.give(key, launch)
        return out

    def _launch(self, a, b, out, accumulate: bool, epilogue: CpuEpilogue | None):
        """A function of the data pointers that runs the product for these shapes and strides:
        its blocks, scratch and argument lists are made once (a call then costs a few stores,
        not ~10 us of Python)."""
        from ..cpu.gemm_ir import A_COLS, A_ROWS_PACKED

        m, k = a.shape
        n = b.shape[1]
        flags = self.flags(a, b, accumulate)
        parts = self.blocks(m, n, k, a_packed=bool(flags & (A_COLS | A_ROWS_PACKED)))
        scratch = [
            tuple(np.empty(size, np.float32) for size in self.spec.scratch(n1 - n0))
            for _, _, n0, n1 in parts
        ]
        epi_args = np.zeros(max(1, epilogue.n_pointers if epilogue else 0), np.int64)
        rows = [
            [
                m0,
                m1,
                n0,
                n1,
                k,
                0,
                a.strides[0] // 4,
                a.strides[1] // 4,
                0,
                b.strides[0] // 4,
                b.strides[1] // 4,
                0,
                out.strides[0] // 4,
                data_ptr(pa),
                data_ptr(pb),
                flags,
                epilogue.address if epilogue else 0,
                data_ptr(epi_args),
            ]
            for (m0, m1, n0, n1), (pa, pb) in zip(parts, scratch)
        ]
        n_epi = epilogue.n_pointers if epilogue else 0
        fn = self._fn
        if len(rows) == 1:
            args = rows[0]

            def run(pa, pb, po, extra):
                args[_A], args[_B], args[_C] = pa, pb, po
                if n_epi:
                    epi_args[:] = extra
                fn(*args)
        else:
            pool = kernel_threads.native_workers()
            if pool is None:

                def run(pa, pb, po, extra):
                    for r in rows:
                        r[_A], r[_B], r[_C] = pa, pb, po
                    if n_epi:
                        epi_args[:] = extra
                    kernel_threads.run_chunks(fn, [tuple(r) for r in rows], self.threads)
            else:
                blocks = np.zeros((len(rows), pool.max_args), np.int64)
                blocks[:, : len(rows[0])] = rows
                address, threads = self.address, self.threads

                def run(pa, pb, po, extra):
                    blocks[:, _A], blocks[:, _B], blocks[:, _C] = pa, pb, po
                    if n_epi:
                        epi_args[:] = extra
                    pool.run_blocks(address, blocks, threads)

        run.scratch, run.epi_args = scratch, epi_args
        return run


_GEMMS: dict[bool | str, CpuGemm] = {}  # narrow -> CpuGemm; "short": packed_b_gemm's
_GEMMS_LOCK = threading.Lock()


def use_blocks(blocks: dict | None) -> bool:
    """Block our GEMM's products as a calibrated profile says ({"kc", "mc"}; None or {}: the
    shipped blocks of gemm_tiles.py). True when that changed the tiles: the shared CpuGemms
    are dropped and the next product compiles (or finds in the kernel cache) the new kernel."""
    wide, narrow = with_blocks(HOST_WIDE, blocks), with_blocks(HOST_NARROW, blocks)
    short = with_blocks(HOST_SHORT, blocks)
    with _GEMMS_LOCK:
        if wide == WIDE and narrow == NARROW and short == SHORT:
            return False
        for tile, new in ((WIDE, wide), (NARROW, narrow), (SHORT, short)):
            tile.clear()
            tile.update(new)
        _GEMMS.clear()
    return True


# Unset (DLVM_EQ_GEMM=auto), products go to numpy's BLAS on every host: measured at the program
# level it was faster wherever we looked. On the 2-core AVX2 EPYC (2026-12-01, idle) OpenBLAS ran
# the MLP, transformer and CNN products at 80-130 GFLOP/s against 40-96 through our 6x16 tile.
# On a 2-core AVX-512 Xeon (2026-12-05), where our 12x32 tile had been the default, the
# training steps of benchmarks/egraph_value.py ran faster through OpenBLAS in two alternated
# runs each: attention 1.75x, the transformer layer 1.65x, the user's 256-chain 1.77x, the MLP
# 1.17x, the CNN, LSTM, matrix factorization and logistic loss within 5%; its small products
# (64-128 a side, attention's) took 12-30 us through ours against 4-16 through OpenBLAS (ours
# pays a launch's set-up and, from PARALLEL_MACS, waking a worker). Our GEMM stays for
# DLVM_EQ_GEMM=1: under load the order flips (OpenBLAS's spinning threads lose their core: the
# transformer step 0.35 s through ours against 0.76 s on the EPYC), and it is what runs the
# fused epilogues (a GemmStep).
DEFAULT_ENABLED = False

_ENABLED: bool | None = None


def enabled() -> bool:
    """Our GEMM is used: DLVM_EQ_GEMM=1; "0" never; unset, DEFAULT_ENABLED (read once)."""
    global _ENABLED
    if _ENABLED is None:
        setting = settings().gemm  # DLVM_EQ_GEMM: "0" never, "1" always, "auto" the default
        _ENABLED = setting == "1" if setting in ("0", "1") else DEFAULT_ENABLED
    return _ENABLED


def worth_our_gemm(m: int, k: int, n: int) -> bool:
    """Whether an m x k @ k x n float32 product is one for our GEMM (it is enabled, and the
    product is above GEMM_MIN_MACS): the one test the planner, the executor and gemm_for share."""
    return m * k * n >= GEMM_MIN_MACS and enabled()


def epilogues_enabled() -> bool:
    """GEMM epilogue fusion is on unless DLVM_EQ_EPILOGUES=0 (asked when a plan is made)."""
    return settings().epilogues


def a_order(a: np.ndarray) -> str | None:
    """How the GEMM can read A: "rows" (columns contiguous), "cols" (rows contiguous), None."""
    if a.strides[1] == 4 and a.strides[0] >= 4 * a.shape[1]:
        return "rows"
    if a.strides[0] == 4 and a.strides[1] >= 4 * a.shape[0]:
        return "cols"
    return None


def gemm_for(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> CpuGemm | None:
    """Our GEMM for out = a @ b, or None where numpy's matmul is the better or only choice
    (a caller with an epilogue then runs the epilogue's kernel after numpy's product)."""
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
        return None
    if not (a.dtype == b.dtype == out.dtype == np.float32):
        return None
    m, k = a.shape
    n = b.shape[1]
    if k == 0 or not worth_our_gemm(m, k, n):
        return None
    if a_order(a) is None or not out.flags.c_contiguous or b.strides[0] % 4 or b.strides[1] % 4:
        return None
    return shared_gemm(n <= NARROW["nr"])


def shared_gemm(narrow: bool) -> CpuGemm:
    """The process's CpuGemm of the wide or the narrow micro-tile."""
    g = _GEMMS.get(narrow)
    if g is None:
        with _GEMMS_LOCK:  # one CpuGemm per micro-tile: its launch cache is shared by all
            g = _GEMMS.get(narrow)
            if g is None:
                g = _GEMMS[narrow] = CpuGemm(narrow)
    return g


def packed_b_gemm(m: int) -> CpuGemm:
    """The process's CpuGemm for an m-row product on a B packed with the wide tile's NR
    (pack_b_panels): the SHORT tile where it computes fewer padded rows than the wide one
    (16 rows on AVX-512: 16 against 24), else the wide one. Both share NR, so one packed B
    serves either; each C element is summed in the same order by both (the same bits)."""
    if SHORT["nr"] != WIDE["nr"] or padded_rows(m, SHORT) >= padded_rows(m, WIDE):
        return shared_gemm(False)
    g = _GEMMS.get("short")
    if g is None:
        with _GEMMS_LOCK:
            g = _GEMMS.get("short")
            if g is None:
                g = _GEMMS["short"] = CpuGemm(False, tile=SHORT)
    return g


def prepacking_enabled() -> bool:
    """Whether loops may run products with a loop-invariant B through our GEMM, B packed once
    before the loop (execution/packed_products.py): unless DLVM_EQ_GEMM=0 ("never ours")."""
    return settings().gemm != "0"


def pack_b_panels(b: np.ndarray, nr: int, out: np.ndarray | None = None) -> np.ndarray:
    """B (k x n, any strides) as the GEMM's B_PACKED operand: out[p, kk, j] = B[kk, p*nr + j],
    zeros past n (cpu/gemm_ir.py reads panel p of slice pc at p*k*nr + pc*nr).

    >>> pack_b_panels(np.arange(6, dtype=np.float32).reshape(2, 3), 2).tolist()
    [[[0.0, 1.0], [3.0, 4.0]], [[2.0, 0.0], [5.0, 0.0]]]
    """
    k, n = b.shape
    panels = -(-n // nr)
    if out is None:
        out = np.empty((panels, k, nr), np.float32)
    full = n // nr
    if full:
        np.copyto(out[:full], b[:, : full * nr].reshape(k, full, nr).transpose(1, 0, 2))
    if full < panels:
        rest = n - full * nr
        out[full, :, :rest] = b[:, full * nr :]
        out[full, :, rest:] = 0
    return out


def split_tiles(extent: int, parts: int, unit: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges covering `extent` in about `parts` pieces of whole `unit`s."""
    per_part = -(-extent // parts)  # ceiling division
    step = -(-per_part // unit) * unit
    return [(lo, min(lo + step, extent)) for lo in range(0, extent, step)]


def _rows_collide(row_stride: int, rows: int) -> bool:
    """Whether `rows` rows `row_stride` floats apart fall into fewer than `rows` of the L1's
    64 sets (64-byte lines): read in place they would evict each other (and the packed B)
    while a micro-tile runs. Packing A (a transposing copy) is cheaper then."""
    return len({(i * row_stride * 4 // 64) % 64 for i in range(rows)}) < rows


MAX_SWAP_SCRATCH = 16  # swapped-product scratch matrices kept per thread (one per shape)
_swap = threading.local()  # .scratch: {out shape: matrix}, this thread's own


def _swap_scratch(shape: tuple[int, int]) -> np.ndarray:
    """This thread's scratch matrix for a swapped product of output `shape` (transposed).
    Per thread, because the copy out of it runs after the product, when no lock is held:
    one shared matrix let a second thread overwrite it between its product and the copy
    (69 wrong results in 6,000 calls from two threads)."""
    mine = getattr(_swap, "scratch", None)
    if mine is None:
        mine = _swap.scratch = {}
    t = mine.get(shape)
    if t is None:
        if len(mine) >= MAX_SWAP_SCRATCH:
            mine.clear()
        t = mine[shape] = np.empty(shape[::-1], np.float32)
    return t


def is_outer_product(a_shape, b_shape) -> bool:
    """Whether a @ b shares a dimension of 1 (an outer product, per batch): the executor runs it
    as a broadcasting multiply, which is exact (one product per element, nothing summed) and
    4-6x faster than numpy's matmul, which runs k = 1 in its own loop without BLAS (256x1x256:
    23 us against 103, 1024x1x128: 51 against 206, measured here)."""
    return len(a_shape) >= 2 and len(b_shape) >= 2 and a_shape[-1] == 1


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """out = a @ b through our GEMM; False (nothing done) where numpy should do it.

    A narrow product with a transposed A (e.g. h.T @ dz with 10 columns: A would be packed in
    full for a 10-column result) is computed the other way round, out.T = b.T @ a.T, into a
    scratch matrix of the calling thread that is then copied: B's packing reads h as it lies."""
    n = b.shape[1] if b.ndim == 2 else 0
    if (
        n <= NARROW["nr"]
        and a.ndim == 2
        and a.shape[0] >= 2 * NARROW["nr"]
        and a_order(a) == "cols"
        and b.ndim == 2
        and a_order(b.T) is not None
    ):
        t = _swap_scratch(out.shape)
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
