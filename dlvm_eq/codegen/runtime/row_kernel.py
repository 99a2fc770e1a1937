"""A compiled RowSpec on the CPU: `RowKernel` (rows split over threads) and `compile_rows`.

    >>> k = compile_rows(spec)                  # spec: a kernels.rows.RowSpec
    >>> y, row_max, row_sum = k(x_array)

ABI of the compiled function (cpu/rows_ir.py):
    void k(i64 r0, i64 r1, ptr out_0.., ptr red_0.., ptr in_0.., ptr dims)
where dims = [rows, cols, row stride 0, col stride 0, row stride 1, ...].

Shared state (threads): `_kernels` (compile_rows's memo, a kernel_memo.KernelMemo: a race builds an equal
kernel twice, the last is kept); a RowKernel is immutable after construction. A row is always
computed whole by one call, so results do not depend on how rows are split over threads.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..kernels.row_limit import kernel_kind
from ..kernels.rows import RowSpec
from ..kernels.spec import DTYPES, KernelError
from .buffers import aligned_empty, data_ptr
from .cpu_count import usable_cpus
from .jit import JIT
from .kernel_memo import KernelMemo
from .threads import CHUNKS_PER_THREAD, MIN_PARALLEL_WORK, run_ranges, split_range


def _rows_ir(spec: RowSpec):
    from ..cpu.rows_ir import rows_ir  # the IR builders load on a cache miss only

    return rows_ir(spec)


class RowKernel:
    """A compiled RowSpec: call it on C-contiguous arrays; returns (outputs..., reductions...)."""

    def __init__(self, spec: RowSpec, threads: int | None = None):
        self.spec = spec
        self.threads = threads or usable_cpus()
        if not spec.reductions:
            raise KernelError(f"{spec.name}: a row kernel needs at least one reduction")
        # loaded by spec: the IR is generated only when the kernel is not on disk
        self.ir = JIT.kernel(kernel_kind(spec.cols), spec, lambda: _rows_ir(spec))
        self.address = self.ir.address
        flat = [spec.rows, spec.cols] + [
            s for i in range(len(spec.inputs)) for s in spec.strides(i)
        ]
        self.dims = np.array(flat, dtype=np.int64)
        self.dims_ptr = self.dims.ctypes.data
        n_ptrs = len(spec.outputs) + len(spec.reductions) + len(spec.inputs) + 1
        self.fn = ctypes.CFUNCTYPE(
            None, ctypes.c_int64, ctypes.c_int64, *([ctypes.c_void_p] * n_ptrs)
        )(self.address)
        self.out_dtypes = [DTYPES[d] for d in spec.output_dtypes]
        self.red_dtypes = [DTYPES[d] for d in spec.reduction_dtypes]
        work = spec.rows * spec.cols * (len(spec.reductions) + 1)
        parts = max(1, min(CHUNKS_PER_THREAD * self.threads, work // MIN_PARALLEL_WORK, spec.rows))
        self._chunks = split_range(spec.rows, parts, 1) if spec.rows else []

    def one_call_head(self) -> tuple | None:
        """The leading integer arguments when `run` is one call on the calling thread (as
        CpuKernel.one_call_head: a plan's small row kernels are called directly), else None."""
        return (0, self.spec.rows) if len(self._chunks) == 1 and self.spec.cols != 0 else None

    def run(self, ins, outs, reds) -> None:
        if not self._chunks or self.spec.cols == 0:
            for red, (_, op, init) in zip(reds, self.spec.reductions):
                red.fill(init)
            return
        ptrs = (
            [data_ptr(a) for a in outs] + [data_ptr(a) for a in reds] + [data_ptr(a) for a in ins]
        )
        ptrs.append(self.dims_ptr)
        if len(self._chunks) == 1:
            self.fn(0, self.spec.rows, *ptrs)
            return
        run_ranges(self.fn, self._chunks, ptrs, self.threads)

    def __call__(self, *inputs):
        spec = self.spec
        ins = [np.ascontiguousarray(a, dtype=DTYPES[i.dtype]) for a, i in zip(inputs, spec.inputs)]
        outs = [aligned_empty((spec.rows, spec.cols), d) for d in self.out_dtypes]
        reds = [np.empty(spec.rows, d) for d in self.red_dtypes]
        self.run(ins, outs, reds)
        return tuple(outs) + tuple(reds)


_kernels = KernelMemo()


def compile_rows(spec: RowSpec) -> RowKernel:
    return _kernels.get(spec, lambda: RowKernel(spec))
