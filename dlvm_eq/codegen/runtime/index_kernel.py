"""A compiled IndexSpec on the CPU (take, scatterAdd, sliceScatter, cumsum): `IndexKernel`,
its units split over threads, and `compile_index` (one kernel per equal spec).

    >>> k = compile_index(IndexSpec("take", "f32"))
    >>> bad = k.run(out, x, ids, IndexExtents(outer=1, n=len(ids), size=len(x), inner=64))
    >>> bad          # True when an index was outside [0, size): the caller raises

The object code comes from `jit.JIT` (memory, disk, then cpu/index_ir.py); chunks run on
`threads` (the native pool, the caller included).

Shared state (threads): `_kernels` (a kernel_memo.KernelMemo; a race builds an equal kernel twice, the
last is kept); an IndexKernel is immutable after construction and `run` keeps its flag word
per call, so one kernel may run on many threads at once. Results do not depend on the thread
count: every unit (an output row, a cumsum line) is computed whole by one call.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..kernels.index_spec import IndexExtents, IndexSpec
from .buffers import data_ptr
from .cpu_count import usable_cpus
from .jit import JIT
from .kernel_memo import KernelMemo
from .threads import CHUNKS_PER_THREAD, MIN_PARALLEL_WORK, run_ranges, split_range

# Smallest share of a threaded call (elements moved): below ~8K a chunk costs more to hand out
# than to run (cpu_kernel.MIN_CHUNK_WORK measured the same for maps).
MIN_CHUNK_WORK = 1 << 13


def _index_ir(spec: IndexSpec):
    from ..cpu.index_ir import index_ir  # the IR builders load on a cache miss only

    return index_ir(spec)


class IndexKernel:
    """A compiled IndexSpec; `run` takes C-contiguous arrays and the call's extents."""

    def __init__(self, spec: IndexSpec, threads: int | None = None):
        self.spec = spec
        self.threads = threads or usable_cpus()
        self.ir = JIT.kernel("index", spec, lambda: _index_ir(spec))
        self.fn = ctypes.CFUNCTYPE(
            None, ctypes.c_int64, ctypes.c_int64, *([ctypes.c_void_p] * 4), *([ctypes.c_int64] * 5)
        )(self.ir.address)

    def run(
        self, out: np.ndarray, src: np.ndarray, ids: np.ndarray | None, ext: IndexExtents
    ) -> bool:
        """Compute `out`; True when an index was out of range (its rows are then zeros)."""
        kind = self.spec.kind
        units = ext.rows(kind)
        if units == 0:
            return False
        flag = np.zeros(1, np.int64)  # per call: calls on other threads have their own
        tail = (
            data_ptr(out),
            data_ptr(src),
            0 if ids is None else data_ptr(ids),
            data_ptr(flag),
            ext.n,
            ext.size,
            ext.inner,
            ext.first,
            ext.step,
        )
        work = ext.work(kind)
        parts = (
            1
            if work < MIN_PARALLEL_WORK or self.threads == 1
            else min(CHUNKS_PER_THREAD * self.threads, work // MIN_CHUNK_WORK, units)
        )
        if kind == "scatterAdd":  # every chunk reads all ids: a few big chunks
            parts = min(parts, max(1, work // max(1, 4 * ext.n * ext.outer)), 2 * self.threads)
        if parts <= 1:
            self.fn(0, units, *tail)
        else:
            run_ranges(self.fn, split_range(units, parts, 1), tail, self.threads)
        return bool(flag[0])


_kernels = KernelMemo()


def compile_index(spec: IndexSpec) -> IndexKernel:
    return _kernels.get(spec, lambda: IndexKernel(spec))
