"""A compiled MapReduceSpec on the CPU: `MapReduceKernel` and `compile_map_reduce`.

    >>> k = compile_map_reduce(spec)             # spec: a kernels.map_reduce.MapReduceSpec
    >>> dz, db = k(g, x)                          # the map's outputs, then the reductions

ABI of the compiled function (cpu/map_reduce_ir.py):
    void k(i64 lo, i64 hi, i64 init, ptr out_0.., ptr red_0.., ptr in_0.., ptr dims)

Determinism: the flat index range is cut into `parts` slices chosen from the spec's sizes
only (never the thread count); each slice folds into its own partial row from the identity,
and the rows are combined in slice order by numpy. The bits are then the same with 1, 2 or 64
threads. Map outputs are computed element by element wherever a slice boundary falls.

Shared state (threads): `_kernels` (a kernel_memo.KernelMemo: a race builds an equal kernel
twice, the last is kept); a MapReduceKernel is immutable after construction, its partial rows
are allocated per call.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from ..kernels.map_reduce import MapReduceSpec, map_reduce_dims, map_reduce_layout
from ..kernels.reference import REDUCE_NP
from ..kernels.rows import reduce_identity
from ..kernels.spec import DTYPES
from .buffers import aligned_empty, data_ptr
from .cpu_count import usable_cpus
from .jit import JIT
from .kernel_memo import KernelMemo
from .threads import MIN_PARALLEL_WORK, run_chunks, split_range

# At most this many slices (as cpu_kernel.REDUCE_SLICES: enough for 16 threads), and the
# partial rows at most 1/PARTIAL_SHARE of the elements the kernel reads.
MAX_SLICES = 64
PARTIAL_SHARE = 8


def slices(spec: MapReduceSpec) -> int:
    """How many slices a call is cut into: from the spec's sizes alone."""
    n = spec.size
    n_red = sum(max(1, math.prod(spec.out_shape(j))) for j in range(len(spec.reductions)))
    return max(1, min(MAX_SLICES, n // MIN_PARALLEL_WORK, n // (PARTIAL_SHARE * n_red)))


def _ir(spec: MapReduceSpec):
    from ..cpu.map_reduce_ir import map_reduce_ir  # the IR builders load on a cache miss only

    return map_reduce_ir(spec)


class MapReduceKernel:
    """A compiled MapReduceSpec: call it on C-contiguous arrays; returns (outputs..., reductions...)."""

    def __init__(self, spec: MapReduceSpec, threads: int | None = None):
        self.spec = spec
        self.threads = threads or usable_cpus()
        self.ir = JIT.kernel("mapreduce", spec, lambda: _ir(spec), map_reduce_layout(spec))
        self.address = self.ir.address
        self.dims = map_reduce_dims(spec)
        self.dims_ptr = self.dims.ctypes.data
        n_ptrs = len(spec.outputs) + len(spec.reductions) + len(spec.inputs) + 1
        self.fn = ctypes.CFUNCTYPE(None, *([ctypes.c_int64] * 3), *([ctypes.c_void_p] * n_ptrs))(
            self.address
        )
        self.out_dtypes = [DTYPES[d] for d in spec.output_dtypes]
        self.red_dtypes = [DTYPES[d] for d in spec.reduction_dtypes]
        self.identities = [
            reduce_identity(op, dt)
            for (_, op, _), dt in zip(spec.reductions, spec.reduction_dtypes)
        ]
        self.out_sizes = [max(1, math.prod(spec.out_shape(j))) for j in range(len(spec.reductions))]
        self._chunks = split_range(spec.size, slices(spec)) if spec.size else []

    def one_call_head(self) -> tuple | None:
        """The leading integer arguments when `run` is one call on the calling thread (as
        CpuKernel.one_call_head), else None."""
        return (0, self.spec.size, 1) if len(self._chunks) == 1 else None

    def one_thread_head(self) -> tuple | None:
        """The leading integers of one call with the bits `run` gives, for the native loop driver
        (execution/native_loop.py; as CpuKernel.one_thread_head): only a call `run` makes in
        one slice. A call cut in slices (partial rows combined by numpy) or over nothing: None,
        and its loop runs on the Python driver."""
        return self.one_call_head()

    def run(self, ins, outs, reds) -> None:
        if not self._chunks:
            for red, v in zip(reds, self.identities):
                red.fill(v)
            return
        in_ptrs = [data_ptr(a) for a in ins]
        out_ptrs = [data_ptr(a) for a in outs]
        if len(self._chunks) == 1:
            self.fn(0, self.spec.size, 1, *out_ptrs, *map(data_ptr, reds), *in_ptrs, self.dims_ptr)
            return
        parts = len(self._chunks)
        partial = [np.empty((parts, n), d) for n, d in zip(self.out_sizes, self.red_dtypes)]
        run_chunks(
            self.fn,
            [
                (lo, hi, 1, *out_ptrs, *(data_ptr(p[t]) for p in partial), *in_ptrs, self.dims_ptr)
                for t, (lo, hi) in enumerate(self._chunks)
            ],
            self.threads,
        )
        with np.errstate(all="ignore"):  # in slice order, whatever thread computed each
            for p, red, (_, op, _) in zip(partial, reds, self.spec.reductions):
                REDUCE_NP[op].reduce(p, axis=0, out=red.reshape(-1))

    def __call__(self, *inputs):
        spec = self.spec
        ins = [np.ascontiguousarray(a, dtype=DTYPES[i.dtype]) for a, i in zip(inputs, spec.inputs)]
        outs = [aligned_empty(spec.shape, d) for d in self.out_dtypes]
        reds = [np.empty(spec.out_shape(j), d) for j, d in enumerate(self.red_dtypes)]
        self.run(ins, outs, reds)
        return tuple(outs) + tuple(reds)


_kernels = KernelMemo()


def compile_map_reduce(spec: MapReduceSpec, threads: int | None = None) -> MapReduceKernel:
    return _kernels.get((spec, threads), lambda: MapReduceKernel(spec, threads))


__all__ = ["MapReduceKernel", "compile_map_reduce", "slices"]
