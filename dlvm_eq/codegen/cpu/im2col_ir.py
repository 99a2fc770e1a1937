"""LLVM IR for the host's im2col and col2im kernels (`conv_ir`; the GPU's is gpu/im2col_ptx.py).

ABI, both kernels (a call covers items [lo, hi): im2col rows r*images + n, col2im planes
c*images + n, the plane n*C + c of dx):
    void k(i64 lo, i64 hi, ptr noalias dst, ptr noalias src, ptr noalias dims)
with dims = [image_stride, row_stride, images] of the column matrix (kernels/conv_spec.py).

    >>> kir = conv_ir(Im2colSpec(g))      # CpuIR; the symbol hashes the IR
"""

from __future__ import annotations

from llvmlite import ir

from ..kernels.conv_spec import Col2imSpec, Im2colSpec
from ..llvm.emitter import I64
from ..llvm.loops import counted_loop, i64
from ..llvm.window_loops import col2im_plane, im2col_row
from .llvm_cpu import CpuIR, mark_noalias, symbol_for, target_machine

PTR = ir.PointerType()


def _build(spec: Im2colSpec | Col2imSpec, symbol: str, triple: str, datalayout: str) -> ir.Module:
    module = ir.Module(name="dlvm_eq")
    module.triple, module.data_layout = triple, datalayout
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64, I64, PTR, PTR, PTR]), symbol)
    mark_noalias(fn, 2)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    lo, hi, dst, src, dims = fn.args
    image_stride, row_stride, images = (
        b.load(b.gep(dims, [i64(j)], inbounds=True, source_etype=I64), typ=I64) for j in (0, 1, 2)
    )
    body = im2col_row if isinstance(spec, Im2colSpec) else col2im_plane
    counted_loop(
        b,
        lo,
        hi,
        lambda b, i: body(b, i, dst, src, image_stride, row_stride, images, spec.geometry),
        "items",
    )
    b.ret_void()
    return module


def conv_ir(spec: Im2colSpec | Col2imSpec) -> CpuIR:
    tm = target_machine()
    text, symbol = symbol_for(lambda sym: str(_build(spec, sym, tm.triple, str(tm.target_data))))
    return CpuIR(text, symbol, None, spec.name)
