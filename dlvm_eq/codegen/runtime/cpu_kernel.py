"""Elementwise and reduction kernels on the CPU: `CpuKernel` (a callable on numpy arrays that
splits the index range over threads) and `compile_cpu` (one kernel per equal spec).

    >>> k = compile_cpu(KernelSpec("axpb", (1000,), [KernelInput("f32")], [Load(0) * 2.0 + 1.0]))
    >>> y = k(np.ones(1000, np.float32))            # one output: an array; several: a tuple

The object code comes from `jit.JIT` (memory, then disk, then LLVM); chunks run on
`threads` (the native pool or Python threads); buffers come from `buffers`.

Shared state (threads; every object here may be used by many Python threads at once):
- `_kernels` (compile_cpu's memo, a kernel_memo.KernelMemo): two threads may both build an
  equal kernel, the last one is kept, both are valid;
- `CpuKernel`: immutable after construction (its dims array is only read); a reduction's
  partial rows are allocated per call;
- results do not depend on the thread count: maps compute every element alike wherever a
  chunk boundary falls, reductions are cut into slices chosen by their sizes only
  (REDUCE_SLICES, `CpuKernel.run_reduce`), combined in slice order.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from ..kernels.kernel_spec import KernelSpec, ReduceSpec
from ..kernels.layout import group_size, spec_layout
from ..kernels.reference import REDUCE_NP
from ..kernels.spec import DTYPES, KernelError
from .buffers import BufferPool, aligned_empty, data_ptr
from .cpu_count import usable_cpus
from .jit import JIT, cpu_ir
from .kernel_memo import KernelMemo
from .threads import (
    ALIGN,
    CHUNKS_PER_THREAD,
    MIN_PARALLEL_WORK,
    run_chunks,
    run_ranges,
    split_range,
)

# A long reduction with few outputs is cut into at most this many slices of the reduced axes,
# whatever the thread count (see CpuKernel.run_reduce): enough to share among 16 threads.
REDUCE_SLICES = 64
# Smallest chunk of a parallel map kernel (elements). A claim costs ~0.1 us in the native pool,
# so chunks far smaller than MIN_PARALLEL_WORK are cheap, and with 2 x MIN_PARALLEL_WORK
# elements split in 2, a helper descheduled holding one chunk held half the kernel.
MIN_CHUNK_WORK = 1 << 13
# Reductions over leading axes with at most this many outputs run as slices of the reduced
# axes over whole rows of outputs (`_rows_of_outputs`); each slice at least MIN_SLICE_ROWS
# rows, so the partial rows are at most 1/MIN_SLICE_ROWS of the input.
ROW_SLICE_OUTPUTS = 1 << 15
MIN_SLICE_ROWS = 8


class CpuKernel:
    """A compiled kernel. Call it on C-contiguous numpy arrays (scalars are accepted for
    inputs of size 1); outputs come from `out=`, the `pool`, or are freshly allocated."""

    def __init__(
        self,
        spec: KernelSpec | ReduceSpec,
        pool: BufferPool | None = None,
        threads: int | None = None,
    ):
        self.spec = spec
        self.pool = pool
        self.threads = threads or usable_cpus()
        # the IR is generated only when the kernel is not on disk (or `.ir.text` is read)
        self.ir = JIT.kernel(
            "map" if isinstance(spec, KernelSpec) else "reduce",
            spec,
            lambda: cpu_ir(spec),
            spec_layout(spec),
        )
        self.address = self.ir.address
        self.dims = self.ir.layout.dims_array()
        self.dims_ptr = self.dims.ctypes.data
        self._in_dtypes = [DTYPES[d] for d in spec.input_dtypes]
        self._in_sizes = [inp.min_size(spec.shape) for inp in spec.inputs]
        is_map = isinstance(spec, KernelSpec)
        n_ptrs = (len(spec.outputs) if is_map else 1) + len(spec.inputs) + 1
        proto = ctypes.CFUNCTYPE(
            None, *([ctypes.c_int64] * (2 if is_map else 4)), *([ctypes.c_void_p] * n_ptrs)
        )
        self.fn = proto(self.address)  # a CFUNCTYPE call releases the GIL
        self.size = math.prod(spec.shape)
        self._n_in = len(spec.inputs)
        if is_map:
            self.out_shapes = [spec.shape] * len(spec.outputs)
            self.out_dtypes = [DTYPES[d] for d in spec.output_dtypes]
        else:
            self.out_shapes = [spec.out_shape]
            self.out_dtypes = [DTYPES[spec.dtype]]

    def __repr__(self):
        return f"CpuKernel({self.spec.name!r}, symbol={self.ir.symbol})"

    def _inputs(self, arrays) -> list:
        if len(arrays) != self._n_in:
            raise KernelError(f"{self.spec.name}: expected {self._n_in} inputs, got {len(arrays)}")
        arrays = list(arrays)
        for i, (a, dt, size) in enumerate(zip(arrays, self._in_dtypes, self._in_sizes)):
            if type(a) is not np.ndarray:
                a = arrays[i] = np.asarray(a, dtype=dt)
            if a.dtype != dt or a.size < size or not a.flags.c_contiguous:
                raise KernelError(
                    f"{self.spec.name}: input {i} must be a C-contiguous {dt} array with at "
                    f"least {size} elements, got {a.dtype} {a.shape}"
                )
        return arrays

    def _outputs(self, out) -> list[np.ndarray]:
        if out is None:
            if self.pool is not None:
                return [self.pool.acquire(s, d) for s, d in zip(self.out_shapes, self.out_dtypes)]
            return [aligned_empty(s, d) for s, d in zip(self.out_shapes, self.out_dtypes)]
        outs = [out] if isinstance(out, np.ndarray) else list(out)
        for j, (o, s, d) in enumerate(zip(outs, self.out_shapes, self.out_dtypes)):
            if o.shape != s or o.dtype != d or not o.flags.c_contiguous:
                raise KernelError(
                    f"{self.spec.name}: out[{j}] must be a C-contiguous {d} array of shape {s}"
                )
        if len(outs) != len(self.out_shapes):
            raise KernelError(f"{self.spec.name}: expected {len(self.out_shapes)} outputs")
        return outs

    def __call__(self, *inputs, out=None):
        ins = self._inputs(inputs)
        outs = self._outputs(out)
        if isinstance(self.spec, KernelSpec):
            self.run_map(ins, outs)
        else:
            self.run_reduce(ins, outs[0])
        return outs[0] if len(outs) == 1 else tuple(outs)

    def one_call_head(self) -> tuple | None:
        """The leading integer arguments when this kernel runs as one call on the calling
        thread (what run_map / run_reduce decide for its sizes), else None: a plan's small
        kernels are then called directly, their arguments ready."""
        spec = self.spec
        if isinstance(spec, KernelSpec):
            n = self.size
            return (0, n) if n > 0 and (n < 2 * MIN_PARALLEL_WORK or self.threads == 1) else None
        if spec.init != spec.identity or 0 in spec.shape:
            return None
        n_out, n_red = max(1, math.prod(spec.out_shape)), group_size(self.ir.layout, 1)
        return (0, n_out, 0, n_red) if n_out * n_red < MIN_PARALLEL_WORK else None

    def one_thread_head(self) -> tuple | None:
        """The leading integers of one call that runs the whole kernel on the calling thread
        with the bits run_map / run_reduce give (their chunks are independent; the native loop
        driver calls it so), else None: a kernel over nothing, or a reduction that run_reduce
        cuts in slices (partial results combined) or finishes in numpy."""
        head = self.one_call_head()
        if head is not None:
            return head
        spec = self.spec
        if isinstance(spec, KernelSpec):
            return (0, self.size) if self.size > 0 else None
        n_out = max(1, math.prod(spec.out_shape))
        n_red = group_size(self.ir.layout, 1)
        if spec.init != spec.identity or 0 in spec.shape:
            return None
        parts = max(1, min(REDUCE_SLICES, n_out * n_red // MIN_PARALLEL_WORK))
        if parts > 1 and _rows_of_outputs(self.ir.layout, n_out, n_red):
            return None
        return (0, n_out, 0, n_red) if parts == 1 or n_out >= 4 * parts else None

    def run_map(self, ins, outs):
        n = self.size
        if n == 0:
            return
        ptrs = [data_ptr(o) for o in outs]
        ptrs += [data_ptr(a) for a in ins]
        ptrs.append(self.dims_ptr)
        if n < 2 * MIN_PARALLEL_WORK or self.threads == 1:
            self.fn(0, n, *ptrs)  # the common small case: no splitting at all
            return
        parts = min(CHUNKS_PER_THREAD * self.threads, n // MIN_CHUNK_WORK)
        run_ranges(self.fn, split_range(n, parts), ptrs, self.threads)

    def run_reduce(self, ins, out):
        spec, lay = self.spec, self.ir.layout
        n_out = out.size
        n_red = group_size(lay, 1) if 0 not in spec.shape else 0
        if n_out == 0:
            return
        if n_red == 0:
            out.fill(spec.init)
            return
        in_ptrs = [data_ptr(a) for a in ins]
        work = n_out * n_red
        # How a reduction is cut depends on its sizes only, never on the thread count: the
        # result is then the same bits with 1, 2 or 64 threads, busy cores or not.
        parts = max(1, min(REDUCE_SLICES, work // MIN_PARALLEL_WORK))
        if parts > 1 and _rows_of_outputs(lay, n_out, n_red):
            # kept trailing axes and few outputs (a bias gradient: (16, 128, 1024) -> (1024,)):
            # split into a few outputs each, every call would read a short piece of each input
            # row, one page apart (measured 12 ms instead of 0.3); slices of whole rows instead
            parts = min(parts, n_red // MIN_SLICE_ROWS)
        elif parts == 1 or n_out >= 4 * parts:
            # Split the outputs: one call reduces an output whole, so where the outputs are
            # split (here by thread count) changes no result.
            split = max(1, min(CHUNKS_PER_THREAD * self.threads, work // MIN_PARALLEL_WORK))
            run_ranges(
                self.fn,
                split_range(n_out, split, 1 if n_out < ALIGN * split else ALIGN),
                (0, n_red, data_ptr(out), *in_ptrs, self.dims_ptr),
                self.threads,
            )
            self._apply_init(out)
            return
        # Few outputs, long reductions: `parts` fixed slices, each reduced into its own partial
        # row by whichever thread takes it, then the rows combined in slice order.
        chunks = split_range(n_red, parts, 1)
        partial = np.empty((len(chunks), n_out), dtype=out.dtype)
        run_chunks(
            self.fn,
            [
                (0, n_out, lo, hi, data_ptr(partial[t]), *in_ptrs, self.dims_ptr)
                for t, (lo, hi) in enumerate(chunks)
            ],
            self.threads,
        )
        with np.errstate(all="ignore"):
            REDUCE_NP[spec.op].reduce(partial, axis=0, out=out.reshape(-1))
        self._apply_init(out)

    def _apply_init(self, out):
        if self.spec.init != self.spec.identity:  # the kernel folds from the identity
            with np.errstate(all="ignore"):
                REDUCE_NP[self.spec.op](out, np.asarray(self.spec.init, out.dtype), out=out)


def _rows_of_outputs(layout, n_out: int, n_red: int) -> bool:
    """Whether a reduction runs as slices of the reduced axes, each call updating whole rows of
    outputs: leading axes reduced, kept axes after them (a call's inner loop walks a row of
    outputs; with kept axes before the reduced ones too, splitting the outputs measured faster),
    at most ROW_SLICE_OUTPUTS outputs and two slices of MIN_SLICE_ROWS (the slices' partial
    rows stay small). Decided by sizes only, so the summation order never depends on the
    thread count."""
    return (
        layout.groups[0] == 0
        and group_size(layout, 2) > 1
        and n_out <= ROW_SLICE_OUTPUTS
        and n_red >= 2 * MIN_SLICE_ROWS
    )


_kernels = KernelMemo()


def compile_cpu(spec: KernelSpec | ReduceSpec, pool: BufferPool | None = None) -> CpuKernel:
    """A CpuKernel for `spec`, reused for equal specs (and pools) within the process."""
    return _kernels.get((spec, id(pool)), lambda: CpuKernel(spec, pool=pool))
