"""IndexSpec -> LLVM IR for the host CPU: take, scatterAdd, sliceScatter and cumsum over
(outer, axis, inner) blocks (kernels/index_spec.py), the inner rows copied or added as vector
loops.

ABI (every kind; arguments a kind does not use are ignored):
    void k(i64 lo, i64 hi, ptr noalias out, ptr noalias src, ptr noalias ids, ptr flag,
           i64 n, i64 size, i64 inner, i64 first, i64 step)
[lo, hi) are units of `IndexExtents.rows`: output rows (take: outer*n; scatterAdd and
sliceScatter: outer*size) or cumsum's lines (outer*inner). A unit is computed whole by one
call and its result does not depend on where the range was cut, so threads may take any
sub-ranges. An index outside [0, size) is never followed: its row is zeros and `flag` gets 1
(the caller raises the interpreter's error then).

Summation order is the interpreter's: scatterAdd adds g's rows in ascending j into a zeroed
row (np.add.at), cumsum runs along the axis from its first element copied (np.cumsum), both in
the values' own dtype and with no fast-math flags, so f32 results are the interpreter's bits.

    >>> kir = index_ir(IndexSpec("take", "f32"))      # CpuIR(text, symbol, None, "index")
"""

from __future__ import annotations

from llvmlite import ir

from ..kernels.index_spec import IndexSpec
from ..kernels.spec import DTYPES
from ..llvm.emitter import I32, I64
from ..llvm.loops import counted_loop, entry_alloca, i64
from ..llvm.lower_expr import storage_type
from .llvm_cpu import CpuIR, symbol_for, target_machine

PTR = ir.PointerType()
N_PTRS = 4  # out, src, ids, flag


def _copy_type(dt: str) -> ir.Type:
    """Values that are only moved are moved as integers of their width (NaN payloads intact)."""
    return ir.IntType(8 * DTYPES[dt].itemsize)


def _at(b, ptr, idx, t):
    return b.gep(ptr, [idx], inbounds=True, source_etype=t)


def _bytes(b, count, t):
    return b.mul(
        count, i64(t.width // 8 if isinstance(t, ir.IntType) else {"float": 4, "double": 8}[str(t)])
    )


def _copy(b, dst, src, count, t):
    """count elements of type t, as llvm.memcpy (what LLVM makes of a copy loop anyway)."""
    fn = b.module.globals.get("llvm.memcpy.p0.p0.i64") or ir.Function(
        b.module,
        ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, ir.IntType(1)]),
        "llvm.memcpy.p0.p0.i64",
    )
    b.call(fn, [dst, src, _bytes(b, count, t), ir.Constant(ir.IntType(1), 0)])


def _zero(b, dst, count, t):
    """count elements of type t set to 0 (all bits zero: 0.0 too), as llvm.memset (what LLVM
    makes of a zeroing loop where it recognizes one; here wherever the loop sits)."""
    fn = b.module.globals.get("llvm.memset.p0.i64") or ir.Function(
        b.module,
        ir.FunctionType(ir.VoidType(), [PTR, ir.IntType(8), I64, ir.IntType(1)]),
        "llvm.memset.p0.i64",
    )
    b.call(
        fn, [dst, ir.Constant(ir.IntType(8), 0), _bytes(b, count, t), ir.Constant(ir.IntType(1), 0)]
    )


def _add(b, x, y, dt: str):
    """x + y in the values' dtype, no fast-math flags: the interpreter's rounding exactly."""
    return b.fadd(x, y) if dt in ("f32", "f64") else b.add(x, y)


def _flag(b, flag):
    b.atomic_rmw("xchg", flag, ir.Constant(I64, 1), "monotonic")  # other threads may set it too


def _index(b, ids, j):
    return b.sext(b.load(_at(b, ids, j, I32), typ=I32), I64)


def _segments(b, lo, hi, width, body, name):
    """body(b, a, s0, s1) for every block a met by [lo, hi) of a space of blocks `width` long,
    [s0, s1) the part of block a inside the range."""
    with b.if_then(b.icmp_signed("<", lo, hi)):
        a_lo = b.udiv(lo, width)
        a_hi = b.add(b.udiv(b.sub(hi, i64(1)), width), i64(1))

        def per_block(b, a):
            base = b.mul(a, width)
            s0 = b.sub(b.select(b.icmp_signed(">", lo, base), lo, base), base)
            end = b.add(base, width)
            s1 = b.sub(b.select(b.icmp_signed("<", hi, end), hi, end), base)
            body(b, a, s0, s1)

        counted_loop(b, a_lo, a_hi, per_block, name)


def _take(b, spec, lo, hi, out, src, ids, flag, n, size, inner):
    t = _copy_type(spec.dtype)
    a_slot, j_slot = entry_alloca(b, I64, "a"), entry_alloca(b, I64, "j")
    with b.if_then(b.icmp_signed("<", lo, hi)):
        b.store(b.udiv(lo, n), a_slot)
        b.store(b.urem(lo, n), j_slot)

        def row(b, r):
            a, j = b.load(a_slot, typ=I64), b.load(j_slot, typ=I64)
            s = _index(b, ids, j)
            dst = _at(b, out, b.mul(r, inner), t)
            with b.if_else(b.icmp_unsigned("<", s, size)) as (inside, outside):
                with inside:
                    _copy(b, dst, _at(b, src, b.mul(b.add(b.mul(a, size), s), inner), t), inner, t)
                with outside:
                    _zero(b, dst, inner, t)
                    _flag(b, flag)
            j1 = b.add(j, i64(1))
            wrap = b.icmp_signed("==", j1, n)
            b.store(b.select(wrap, i64(0), j1), j_slot)
            b.store(b.add(a, b.zext(wrap, I64)), a_slot)

        counted_loop(b, lo, hi, row, "rows")


def _scatter_add(b, spec, lo, hi, out, src, ids, flag, n, size, inner):
    t = storage_type(spec.dtype)

    def block(b, a, s0, s1):
        base = b.mul(a, size)
        _zero(b, _at(b, out, b.mul(b.add(base, s0), inner), t), b.mul(b.sub(s1, s0), inner), t)
        g_rows = b.mul(a, n)

        def per_id(b, j):
            s = _index(b, ids, j)
            mine = b.and_(b.icmp_signed(">=", s, s0), b.icmp_signed("<", s, s1))
            with b.if_then(mine):
                dst = _at(b, out, b.mul(b.add(base, s), inner), t)
                g = _at(b, src, b.mul(b.add(g_rows, j), inner), t)

                def add(b, c):
                    p = _at(b, dst, c, t)
                    b.store(
                        _add(b, b.load(p, typ=t), b.load(_at(b, g, c, t), typ=t), spec.dtype), p
                    )

                counted_loop(b, i64(0), inner, add, "acc")
            with b.if_then(b.icmp_unsigned(">=", s, size)):
                _flag(b, flag)

        counted_loop(b, i64(0), n, per_id, "ids")

    _segments(b, lo, hi, size, block, "blocks")


def _slice_scatter(b, spec, lo, hi, out, src, n, size, inner, first, step):
    t = _copy_type(spec.dtype)
    k_slot = entry_alloca(b, I64, "k")

    def block(b, a, s0, s1):
        # the first slice entry at or after s0: k = ceil((s0 - first) / step), 0 before `first`
        ahead = b.sub(s0, first)
        k = b.udiv(b.add(ahead, b.sub(step, i64(1))), step)
        b.store(b.select(b.icmp_signed(">", ahead, i64(0)), k, i64(0)), k_slot)
        g_rows = b.mul(a, n)
        base = b.mul(a, size)

        def row(b, s):
            k = b.load(k_slot, typ=I64)
            hit = b.and_(
                b.icmp_signed("<", k, n), b.icmp_signed("==", s, b.add(first, b.mul(k, step)))
            )
            dst = _at(b, out, b.mul(b.add(base, s), inner), t)
            with b.if_else(hit) as (yes, no):
                with yes:
                    _copy(b, dst, _at(b, src, b.mul(b.add(g_rows, k), inner), t), inner, t)
                    b.store(b.add(k, i64(1)), k_slot)
                with no:
                    _zero(b, dst, inner, t)

        counted_loop(b, s0, s1, row, "rows")

    _segments(b, lo, hi, size, block, "blocks")


def _cumsum(b, spec, lo, hi, out, src, n, inner):
    t, dt = storage_type(spec.dtype), spec.dtype
    rev = spec.reverse

    def position(b, k):  # the k-th element visited along the axis
        return b.sub(b.sub(n, i64(1)), k) if rev else k

    def block(b, a, c0, c1):
        width = b.sub(c1, c0)
        line0 = b.add(b.mul(b.mul(a, n), inner), c0)  # element (a, 0, c0)
        first = b.add(line0, b.mul(position(b, i64(0)), inner))
        _copy(b, _at(b, out, first, t), _at(b, src, first, t), width, t)
        back = b.neg(inner) if not rev else inner  # from an element to the one before

        def step(b, k):
            row = b.add(line0, b.mul(position(b, k), inner))
            prev = b.add(row, back)

            def item(b, c):
                p = b.add(row, c)
                v = _add(
                    b,
                    b.load(_at(b, out, b.add(prev, c), t), typ=t),
                    b.load(_at(b, src, p, t), typ=t),
                    dt,
                )
                b.store(v, _at(b, out, p, t))

            counted_loop(b, i64(0), width, item, "line")

        counted_loop(b, i64(1), n, step, "axis")

    with b.if_then(b.icmp_signed(">", n, i64(0))):
        _segments(b, lo, hi, inner, block, "blocks")


def _function(module: ir.Module, spec: IndexSpec, symbol: str) -> None:
    fnty = ir.FunctionType(ir.VoidType(), [I64, I64] + [PTR] * N_PTRS + [I64] * 5)
    fn = ir.Function(module, fnty, symbol)
    fn.attributes.add("nounwind")
    for a in fn.args[2 : 2 + N_PTRS]:
        a.add_attribute("noalias")
    lo, hi, out, src, ids, flag, n, size, inner, first, step = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    if spec.kind == "take":
        _take(b, spec, lo, hi, out, src, ids, flag, n, size, inner)
    elif spec.kind == "scatterAdd":
        _scatter_add(b, spec, lo, hi, out, src, ids, flag, n, size, inner)
    elif spec.kind == "sliceScatter":
        _slice_scatter(b, spec, lo, hi, out, src, n, size, inner, first, step)
    else:
        _cumsum(b, spec, lo, hi, out, src, n, inner)
    b.ret_void()


def index_ir(spec: IndexSpec) -> CpuIR:
    """LLVM IR text for the host CPU; the symbol hashes the IR so equal kernels coincide."""
    tm = target_machine()

    def build(symbol: str) -> str:
        module = ir.Module(name="dlvm_eq")
        module.triple, module.data_layout = tm.triple, str(tm.target_data)
        _function(module, spec, symbol)
        return str(module)

    text, symbol = symbol_for(build)
    return CpuIR(text, symbol, None, "index")
