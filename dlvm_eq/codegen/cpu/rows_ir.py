"""LLVM IR for a RowSpec on the host (`rows_ir`; the GPU version is `gpu/llvm_ptx.py`):
softmax-style patterns in one pass over memory.

    >>> kir = rows_ir(spec)          # spec: a kernels.rows.RowSpec; kir.text is the module

A row is read from DRAM once: the later passes find it in L1/L2. The last reduction's
subexpressions that the map needs again (softmax's `exp(x - max)`) are kept in a stack buffer
for rows of up to kernels/row_limit.py's SCRATCH elements instead of being recomputed (longer
rows recompute them; the choice is compiled in), and large outputs are written with streaming stores (see
llvm/streaming.py). ABI:
    void k(i64 r0, i64 r1, ptr out_0.., ptr red_0.., ptr in_0.., ptr dims)
where dims = [rows, cols, row stride 0, col stride 0, row stride 1, ...]. Constants only.
"""

from __future__ import annotations

from llvmlite import ir

from ..kernels import row_limit
from ..kernels.rows import RowSpec, early_stash, pattern, rebuild, reduce_identity, stash_nodes
from ..kernels.spec import DTYPES, KernelError, Load, dtype_of
from ..llvm.emitter import I64, Emitter
from ..llvm.loops import counted_loop, entry_alloca, i64
from ..llvm.lower_expr import combine, from_storage, init_constant, lower, storage_type, to_storage
from ..llvm.streaming import NT_MIN_BYTES, tiled_streaming
from .llvm_cpu import CpuIR, has_avx512, mark_noalias, symbol_for, target_machine

PTR = ir.PointerType()
SHORT_ROW = 32  # rows at most this long are compiled for their exact length


def _build(spec: RowSpec, symbol: str, triple: str, datalayout: str) -> ir.Module:
    # the IR builders load here: a kernel found in the disk cache is loaded without them
    module = ir.Module(name="dlvm_eq")
    module.triple, module.data_layout = triple, datalayout
    n_in, n_red, n_out = len(spec.inputs), len(spec.reductions), len(spec.outputs)
    fnty = ir.FunctionType(ir.VoidType(), [I64, I64] + [PTR] * (n_out + n_red + n_in + 1))
    fn = ir.Function(module, fnty, symbol)
    mark_noalias(fn, 2)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = Emitter(b, fast_ldexp=has_avx512())
    r0, r1 = fn.args[:2]
    outs = fn.args[2 : 2 + n_out]
    reds = fn.args[2 + n_out : 2 + n_out + n_red]
    ins = fn.args[2 + n_out + n_red : -1]
    dims = fn.args[-1]

    def dim(j):
        return b.load(b.gep(dims, [i64(j)], inbounds=True, source_etype=I64), typ=I64)

    # Short rows: the column count is a constant, so LLVM unrolls the per-row loops and
    # vectorizes across them (a loop of 10 run-time iterations stays scalar: ~10x slower).
    cols = i64(spec.cols) if spec.cols <= SHORT_ROW else dim(1)
    pat = pattern(spec)
    rstride = [i64(p[0]) if p[0] is not None else dim(2 + 2 * i) for i, p in enumerate(pat)]
    cstride = [i64(p[1]) if p[1] is not None else dim(3 + 2 * i) for i, p in enumerate(pat)]
    dtypes = spec.all_dtypes
    odt = spec.output_dtypes
    # Values computed once per element and kept in row buffers (the IR depends on it: one
    # version): those of an earlier reduction that later passes read again (early_stash), then
    # the last reduction's that the outputs read. stash[q] = (reduction, value, dtype), read
    # back as Load(len(dtypes) + q).
    bodies, outputs = [body for body, _, _ in spec.reductions], list(spec.outputs)
    stash: list = []
    scratch = row_limit.SCRATCH  # kernels/row_limit.py: the profile's limit or the shipped one
    if row_limit.keeps(spec.cols, scratch):
        bodies, outputs, stash = early_stash(spec)
        known = dtypes + tuple(dt for *_, dt in stash)
        last = stash_nodes(spec, bodies[-1], outputs)
        stash += [(n_red - 1, v, dtype_of(v, known)) for v in last]
        keep = {v: Load(len(known) + q) for q, v in enumerate(last)}
        outputs = [rebuild(o, keep) for o in outputs]
    stash_dt = [dt for *_, dt in stash]
    all_dt = dtypes + tuple(stash_dt)
    slots = []
    for dt in stash_dt:
        with b.goto_entry_block():
            a = b.alloca(storage_type(dt), size=ir.Constant(I64, scratch), name="stash")
        a.align = 64
        slots.append(a)
    streaming = (
        triple.startswith("x86_64")
        and spec.rows * spec.cols * sum(DTYPES[d].itemsize for d in odt) >= NT_MIN_BYTES
    )

    def per_row(b, r):
        base = [
            b.mul(r, rs) if not (isinstance(rs, ir.Constant) and rs.constant == 0) else i64(0)
            for rs in rstride
        ]
        accs: list = []

        def loader(j):
            def load(i):
                if i >= len(dtypes):  # a value kept in a row buffer
                    q = i - len(dtypes)
                    t = storage_type(stash_dt[q])
                    v = b.load(b.gep(slots[q], [j], inbounds=True, source_etype=t), typ=t)
                    return from_storage(e, v, stash_dt[q])
                if i >= n_in:
                    return accs[i - n_in]
                t = storage_type(dtypes[i])
                cs = cstride[i]
                if isinstance(cs, ir.Constant) and cs.constant == 0:
                    off = base[i]
                elif isinstance(cs, ir.Constant) and cs.constant == 1:
                    off = b.add(base[i], j)
                else:
                    off = b.add(base[i], b.mul(j, cs))
                v = b.load(b.gep(ins[i], [off], inbounds=True, source_etype=t), typ=t)
                return from_storage(e, v, dtypes[i])

            return load

        def reduce(k, body, op, init):
            dt = dtypes[n_in + k]
            ident = init_constant(reduce_identity(op, dt), dt)
            acc = entry_alloca(b, ident.type, f"acc{k}")
            b.store(ident, acc)
            mine = [q for q, (r, _, _) in enumerate(stash) if r == k]  # kept by this pass
            roots = [body] + [stash[q][1] for q in mine]

            def step(b, j):
                vals = lower(e, roots, all_dt, loader(j))
                b.store(combine(e, op, b.load(acc, typ=ident.type), vals[0], dt), acc)
                for q, v in zip(mine, vals[1:]):
                    slot, sdt = slots[q], stash_dt[q]
                    b.store(
                        to_storage(e, v, sdt),
                        b.gep(slot, [j], inbounds=True, source_etype=storage_type(sdt)),
                    )

            counted_loop(b, i64(0), cols, step, f"red{k}")
            v = b.load(acc, typ=ident.type)
            if init != reduce_identity(op, dt):
                v = combine(e, op, v, init_constant(init, dt), dt)
            b.store(
                to_storage(e, v, dt),
                b.gep(reds[k], [r], inbounds=True, source_etype=storage_type(dt)),
            )
            return v

        for k, (_, op, init) in enumerate(spec.reductions):
            accs.append(reduce(k, bodies[k], op, init))
        row_lo = b.mul(r, cols)

        def finish():
            exprs = outputs

            def compute(b, lo, hi, sinks):
                def body_(b, flat):
                    j = b.sub(flat, row_lo)
                    base_load = loader(j)

                    vals = lower(e, exprs, all_dt, base_load)
                    for sink, v, dt in zip(sinks, vals, odt):
                        b.store(to_storage(e, v, dt), sink(b, flat))

                counted_loop(b, lo, hi, body_, "map")

            hi = b.add(row_lo, cols)
            if streaming:
                tiled_streaming(b, row_lo, hi, list(outs), odt, compute)
            else:
                compute(
                    b,
                    row_lo,
                    hi,
                    [
                        (
                            lambda b, flat, p=p, dt=dt: b.gep(
                                p, [flat], inbounds=True, source_etype=storage_type(dt)
                            )
                        )
                        for p, dt in zip(outs, odt)
                    ],
                )

        finish()

    counted_loop(b, r0, r1, per_row, "rows")
    b.ret_void()
    return module


def rows_ir(spec: RowSpec) -> CpuIR:
    """LLVM IR text for the host; the symbol hashes the IR (equal kernels coincide)."""
    if not spec.reductions:
        raise KernelError(f"{spec.name}: a row kernel needs at least one reduction")
    tm = target_machine()
    text, symbol = symbol_for(lambda sym: str(_build(spec, sym, tm.triple, str(tm.target_data))))
    return CpuIR(text, symbol, None, "rows")
