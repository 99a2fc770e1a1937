"""The compiled im2col and col2im kernels on the CPU: `ConvKernel` and `compile_conv`.

    >>> k = compile_conv(Im2colSpec(g))
    >>> k.run(cols, x, images=n, image_stride=g.rows * g.cols, row_stride=g.cols)

Items (im2col rows (r, n), col2im planes (c, n)) are split over threads in whole items; an
item is written by one call only, so results do not depend on the thread count and two
threads never write one element (col2im's sums stay inside a plane).

Shared state (threads): `_kernels` (compile_conv's memo, a kernel_memo.KernelMemo: a race builds an equal
kernel twice, the last is kept); a ConvKernel is immutable; each run has its own dims array.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..kernels.conv_spec import Col2imSpec, Im2colSpec
from ..kernels.spec import DTYPES, KernelError
from .buffers import data_ptr
from .cpu_count import usable_cpus
from .jit import JIT
from .kernel_memo import KernelMemo
from .threads import CHUNKS_PER_THREAD, MIN_PARALLEL_WORK, run_ranges, split_range

_PROTO = ctypes.CFUNCTYPE(
    None, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
)


def _conv_ir(spec):
    from ..cpu.im2col_ir import conv_ir  # the IR builders load on a cache miss only

    return conv_ir(spec)


class ConvKernel:
    """A compiled Im2colSpec or Col2imSpec."""

    def __init__(self, spec: Im2colSpec | Col2imSpec, threads: int | None = None):
        self.spec = spec
        self.threads = threads or usable_cpus()
        self.fn = _PROTO(JIT.kernel(spec.name, spec, lambda: _conv_ir(spec)).address)
        g = spec.geometry
        self.dtype = DTYPES[g.dtype]
        # elements one item touches: im2col a column row, col2im a plane's taps
        self.item_work = g.cols if isinstance(spec, Im2colSpec) else g.taps * g.cols + g.plane

    def run(
        self, dst: np.ndarray, src: np.ndarray, images: int, image_stride: int, row_stride: int
    ) -> None:
        """All items of `images` images from src into dst (C-contiguous arrays of the kernel's
        dtype, large enough: checked, an out-of-bounds pointer would corrupt memory)."""
        g = self.spec.geometry
        im2col = isinstance(self.spec, Im2colSpec)
        items = images * (g.rows if im2col else g.channels)
        x, cols = (src, dst) if im2col else (dst, src)
        col_need = (images - 1) * image_stride + (g.rows - 1) * row_stride + g.cols if items else 0
        for a, need in ((x, images * g.channels * g.plane), (cols, col_need)):
            if a.dtype != self.dtype or not a.flags.c_contiguous or a.size < need:
                raise KernelError(
                    f"{self.spec.name}: needs a C-contiguous {self.dtype} array of at "
                    f"least {need} elements, got {a.dtype} {a.shape}"
                )
        if items == 0:
            return
        dims = np.array([image_stride, row_stride, images], np.int64)
        tail = (data_ptr(dst), data_ptr(src), dims.ctypes.data)
        parts = max(
            1,
            min(
                CHUNKS_PER_THREAD * self.threads, items * self.item_work // MIN_PARALLEL_WORK, items
            ),
        )
        if parts == 1 or self.threads == 1:
            self.fn(0, items, *tail)
            return
        run_ranges(self.fn, split_range(items, parts, 1), tail, self.threads)


_kernels = KernelMemo()


def compile_conv(spec: Im2colSpec | Col2imSpec) -> ConvKernel:
    return _kernels.get(spec, lambda: ConvKernel(spec))
