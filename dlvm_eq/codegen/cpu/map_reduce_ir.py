"""LLVM IR for a MapReduceSpec on the host (`map_reduce_ir`): one loop over the iteration space
that stores the map's outputs and folds every reduction, reading the inputs once.

    >>> kir = map_reduce_ir(spec)        # spec: a kernels.map_reduce.MapReduceSpec

ABI (the range [lo, hi) of flat indices of the iteration space, C order):
    void k(i64 lo, i64 hi, i64 init, ptr out_0.., ptr red_0.., ptr in_0.., ptr dims)
With `init` non-zero the call first sets every reduction element to its op's identity (the
runtime's one-call path and each of its partial rows); then red_j[kept index] is updated in
place. Each reduction's index is one more strided stream of the loop layout (stride 0 along
its reduced axes), so a leading-axis reduction's inner loop walks its outputs contiguously and
a trailing one's keeps its accumulator in a register (LLVM promotes the invariant address).
dims = the layout's dims array, then each reduction's number of elements.
"""

from __future__ import annotations

from llvmlite import ir

from ..kernels.layout import LoopLayout
from ..kernels.map_reduce import MapReduceSpec, map_reduce_dims, map_reduce_layout
from ..kernels.rows import reduce_identity
from ..llvm.emitter import I64, Emitter
from ..llvm.loops import counted_loop, i64, strided_range
from ..llvm.lower_expr import combine, from_storage, init_constant, lower, storage_type, to_storage
from .llvm_cpu import CpuIR, has_avx512, mark_noalias, symbol_for, target_machine

PTR = ir.PointerType()


def _load_i64(b, dims_arg, j: int):
    return b.load(b.gep(dims_arg, [i64(j)], inbounds=True, source_etype=I64), typ=I64)


def _build(spec: MapReduceSpec, lay: LoopLayout, symbol: str, triple: str, dl: str) -> ir.Module:
    module = ir.Module(name="dlvm_eq")  # not spec.name: equal kernels must have equal IR
    module.triple, module.data_layout = triple, dl
    n_in, n_red, n_out = len(spec.inputs), len(spec.reductions), len(spec.outputs)
    fnty = ir.FunctionType(ir.VoidType(), [I64] * 3 + [PTR] * (n_out + n_red + n_in + 1))
    fn = ir.Function(module, fnty, symbol)
    mark_noalias(fn, 3)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = Emitter(b, fast_ldexp=has_avx512())
    lo, hi, init = fn.args[:3]
    outs = fn.args[3 : 3 + n_out]
    reds = fn.args[3 + n_out : 3 + n_out + n_red]
    ins, dims_arg = fn.args[3 + n_out + n_red : -1], fn.args[-1]
    dtypes, odt, rdt = spec.input_dtypes, spec.output_dtypes, spec.reduction_dtypes
    n_dims = len(lay.dims)
    dims = [_load_i64(b, dims_arg, d) for d in range(n_dims)]
    strides = [
        [
            i64(s) if s in (0, 1) else _load_i64(b, dims_arg, lay.stride_index(k, d))
            for d, s in enumerate(st)
        ]
        for k, st in enumerate(lay.strides)
    ]
    sizes_at = n_dims * (1 + len(lay.strides))
    with b.if_then(b.icmp_signed("!=", init, i64(0))):
        for j, (p, (_, op, _), dt) in enumerate(zip(reds, spec.reductions, rdt)):
            n_red_elems = _load_i64(b, dims_arg, sizes_at + j)
            ident = init_constant(reduce_identity(op, dt), dt)
            t = storage_type(dt)
            counted_loop(
                b,
                i64(0),
                n_red_elems,
                lambda b, j, p=p, ident=ident, t=t: b.store(
                    ident, b.gep(p, [j], inbounds=True, source_etype=t)
                ),
                "init",
            )

    def body(b, offs, flat):
        def load(i):
            t = storage_type(dtypes[i])
            v = b.load(b.gep(ins[i], [offs[i]], inbounds=True, source_etype=t), typ=t)
            return from_storage(e, v, dtypes[i])

        roots = list(spec.outputs) + [r for r, _, _ in spec.reductions]
        vals = lower(e, roots, dtypes, load)
        for p, v, dt in zip(outs, vals, odt):
            t = storage_type(dt)
            b.store(to_storage(e, v, dt), b.gep(p, [flat], inbounds=True, source_etype=t))
        for j, (p, v, (_, op, _), dt) in enumerate(zip(reds, vals[n_out:], spec.reductions, rdt)):
            t = storage_type(dt)
            q = b.gep(p, [offs[n_in + j]], inbounds=True, source_etype=t)
            b.store(combine(e, op, b.load(q, typ=t), v, dt), q)

    strided_range(b, lo, hi, dims, strides, [i64(0)] * (n_in + n_red), body)
    b.ret_void()
    return module


def map_reduce_ir(spec: MapReduceSpec) -> CpuIR:
    """LLVM IR text for the host CPU; the symbol hashes the IR so equal kernels coincide."""
    tm = target_machine()
    lay = map_reduce_layout(spec)
    text, symbol = symbol_for(
        lambda sym: str(_build(spec, lay, sym, tm.triple, str(tm.target_data)))
    )
    return CpuIR(text, symbol, lay, "mapreduce")


__all__ = ["map_reduce_dims", "map_reduce_ir", "map_reduce_layout"]
