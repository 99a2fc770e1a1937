"""im2col and col2im as PTX (the loop bodies of llvm/window_loops.py, shared with the CPU):
one GPU thread per item (an im2col row (r, n), a col2im plane (c, n)), a grid-stride loop.

ABI (i64 integers; items = images * rows or images * channels):
    .entry k(i64 items, ptr.global dst, ptr.global src, i64 image_stride, i64 row_stride, i64 images)

    >>> kp = conv_ptx(Im2colSpec(g), arch="sm_90")    # PtxKernel(ptx, symbol, None, 64, "im2col")

`conv_host_emulation_ir` builds the same function for the host with the special registers as
trailing i32 arguments (llvm_ptx.SREGS), so tests run the GPU logic on the CPU. On the GPU the
products are CuPy/cuBLAS's; this module is not wired into GpuProgram (window_ops on CuPy runs
there), see the report of issue 14.
"""

from __future__ import annotations

from llvmlite import ir

from ..kernels.conv_spec import Col2imSpec, Im2colSpec
from ..llvm.emitter import I64
from ..llvm.symbols import symbol_for
from ..llvm.window_loops import col2im_plane, im2col_row
from .llvm_ptx import PtxKernel, compile_ptx, grid_stride, kernel_function, new_module

_PLACEHOLDER = "__dq_conv__"


def _build(spec: Im2colSpec | Col2imSpec, name: str, arch: str, host_emulation: bool) -> ir.Module:
    module = new_module(arch, host_emulation)
    fn = kernel_function(module, name, 1, 2, 3, I64)
    items, dst, src, image_stride, row_stride, images = fn.args[:6]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    body = im2col_row if isinstance(spec, Im2colSpec) else col2im_plane
    grid_stride(
        b, items, lambda b, i: body(b, i, dst, src, image_stride, row_stride, images, spec.geometry)
    )
    b.ret_void()
    return module


def _named(spec, prefix: str, arch: str, host_emulation: bool) -> tuple[str, str]:
    build = lambda name: str(_build(spec, name, arch, host_emulation))
    return symbol_for(build, prefix, _PLACEHOLDER)


def conv_ptx(spec: Im2colSpec | Col2imSpec, arch: str = "sm_75") -> PtxKernel:
    text, symbol = _named(spec, "dq_conv_", arch, False)
    return PtxKernel(compile_ptx(text, arch), symbol, None, 64, spec.name)


def conv_host_emulation_ir(spec: Im2colSpec | Col2imSpec) -> tuple[str, str]:
    """(LLVM IR for the host, symbol): the GPU kernel with SREGS as six trailing i32 arguments."""
    return _named(spec, "dq_gpu_conv_", "sm_75", True)
