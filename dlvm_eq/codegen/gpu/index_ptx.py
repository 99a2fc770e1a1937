"""IndexSpec -> PTX (take, scatterAdd, sliceScatter, cumsum over (outer, axis, inner) blocks,
kernels/index_spec.py) through the NVPTX back end of llvm_ptx.py, grid-stride loops:

    take          one thread per output element
    sliceScatter  one thread per output element (a copy or a zero)
    cumsum        one thread per line (outer*inner of them; neighbours in `inner` read
                  neighbouring addresses), the interpreter's order along the line
    scatterAdd    one thread per element of g, `atomicrmw fadd` (add for i32) into an output
                  the launcher has zeroed

ABI: .entry k(iN total, ptr out, ptr src, ptr ids, ptr flag, iN n, iN size, iN inner,
iN first, iN step); `total` is the number of threads' items (above), iN as in llvm_ptx.
An index outside [0, size) is never followed: its element is 0 (take) or dropped (scatterAdd),
and the i32 at `flag` gets 1.

Why atomics for scatterAdd: the deterministic forms cost too much where embeddings need it.
One thread per output column, looping over the ids in order (the interpreter's order, race
free), has only outer*inner threads (256 for a 256-wide embedding) each walking every id;
sorting the ids by destination first needs a sort per step. Atomic adds touch each element
of g once, at full width. The price: repeated ids are added in whatever order the hardware
serializes them, so f32 results may differ in the last bits from run to run and from the CPU
(which follows the interpreter's order); exact for i32. With no repeated ids it is exact.

    >>> kp = index_ptx(IndexSpec("take", "f32"), bits=32, arch="sm_90")   # a PtxKernel
"""

from __future__ import annotations

from llvmlite import ir

from ..kernels.index_spec import IndexSpec
from ..kernels.spec import DTYPES
from ..llvm.emitter import I32, I64
from ..llvm.lower_expr import storage_type
from ..llvm.symbols import symbol_for
from .llvm_ptx import PtxKernel, compile_ptx, grid_stride, kernel_function, new_module

N_PTRS = 4  # out, src, ids, flag
N_TAIL = 5  # n, size, inner, first, step


def index_bits(total_elements: int) -> int:
    """32 when every element index of the call's arrays stays below 2**30."""
    return 32 if total_elements < 2**30 else 64


def _at(b, ptr, idx, t):
    return b.gep(ptr, [idx], inbounds=True, source_etype=t)


def _index(b, ids, j, t):
    """ids[j] (i32) as the index type, sign-extended: a negative id stays out of range."""
    v = b.load(_at(b, ids, j, I32), typ=I32)
    return v if t.width == 32 else b.sext(v, t)


def _split(b, e, inner, n):
    """(a, j, c) of flat element e of an (outer, n, inner) block."""
    r = b.udiv(e, inner)
    return b.udiv(r, n), b.urem(r, n), b.urem(e, inner)


def _take(b, spec, t, total, out, src, ids, flag, n, size, inner, first, step):
    vt = ir.IntType(8 * DTYPES[spec.dtype].itemsize)  # moved as bits

    def item(b, e):
        a, j, c = _split(b, e, inner, n)
        s = _index(b, ids, j, t)
        ok = b.icmp_unsigned("<", s, size)
        with b.if_else(ok) as (inside, outside):
            with inside:
                v = b.load(
                    _at(b, src, b.add(b.mul(b.add(b.mul(a, size), s), inner), c), vt), typ=vt
                )
                b.store(v, _at(b, out, e, vt))
            with outside:
                b.store(ir.Constant(vt, 0), _at(b, out, e, vt))
                b.atomic_rmw("xchg", flag, ir.Constant(I32, 1), "monotonic")

    grid_stride(b, total, item)


def _scatter_add(b, spec, t, total, out, src, ids, flag, n, size, inner, first, step):
    vt = storage_type(spec.dtype)
    op = "fadd" if spec.dtype in ("f32", "f64") else "add"

    def item(b, e):
        a, j, c = _split(b, e, inner, n)
        s = _index(b, ids, j, t)
        with b.if_else(b.icmp_unsigned("<", s, size)) as (inside, outside):
            with inside:
                dst = _at(b, out, b.add(b.mul(b.add(b.mul(a, size), s), inner), c), vt)
                b.atomic_rmw(op, dst, b.load(_at(b, src, e, vt), typ=vt), "monotonic")
            with outside:
                b.atomic_rmw("xchg", flag, ir.Constant(I32, 1), "monotonic")

    grid_stride(b, total, item)


def _slice_scatter(b, spec, t, total, out, src, ids, flag, n, size, inner, first, step):
    vt = ir.IntType(8 * DTYPES[spec.dtype].itemsize)

    def item(b, e):
        a, s, c = _split(b, e, inner, size)
        ahead = b.sub(s, first)
        k = b.udiv(ahead, step)
        hit = b.and_(
            b.icmp_signed(">=", ahead, ir.Constant(t, 0)),
            b.and_(
                b.icmp_unsigned("==", b.urem(ahead, step), ir.Constant(t, 0)),
                b.icmp_unsigned("<", k, n),
            ),
        )
        with b.if_else(hit) as (yes, no):
            with yes:
                v = b.load(_at(b, src, b.add(b.mul(b.add(b.mul(a, n), k), inner), c), vt), typ=vt)
                b.store(v, _at(b, out, e, vt))
            with no:
                b.store(ir.Constant(vt, 0), _at(b, out, e, vt))

    grid_stride(b, total, item)


def _cumsum(b, spec, t, total, out, src, ids, flag, n, size, inner, first, step):
    vt = storage_type(spec.dtype)
    one = ir.Constant(t, 1)

    def line(b, ln):
        a, c = b.udiv(ln, inner), b.urem(ln, inner)
        base = b.add(b.mul(b.mul(a, n), inner), c)

        def at(b, k):  # the k-th element visited along the line
            i = b.sub(b.sub(n, one), k) if spec.reverse else k
            return b.add(base, b.mul(i, inner))

        p0 = at(b, ir.Constant(t, 0))
        acc0 = b.load(_at(b, src, p0, vt), typ=vt)  # the first element copied, as np.cumsum
        b.store(acc0, _at(b, out, p0, vt))
        entry = b.block  # the running sum is a phi
        head = b.append_basic_block("line.head")
        body = b.append_basic_block("line.body")
        done = b.append_basic_block("line.end")
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(t)
        s = b.phi(vt)
        k.add_incoming(one, entry)
        s.add_incoming(acc0, entry)
        b.cbranch(b.icmp_unsigned("<", k, n), body, done)
        b.position_at_end(body)
        p = at(b, k)
        x = b.load(_at(b, src, p, vt), typ=vt)
        s1 = b.fadd(s, x) if spec.dtype in ("f32", "f64") else b.add(s, x)  # no fast-math flags
        b.store(s1, _at(b, out, p, vt))
        k.add_incoming(b.add(k, one), b.block)
        s.add_incoming(s1, b.block)
        b.branch(head)
        b.position_at_end(done)

    with b.if_then(b.icmp_unsigned(">", n, ir.Constant(t, 0))):
        grid_stride(b, total, line)


_BODIES = {
    "take": _take,
    "scatterAdd": _scatter_add,
    "sliceScatter": _slice_scatter,
    "cumsum": _cumsum,
}


def build_module(
    spec: IndexSpec, symbol: str, bits: int, arch: str = "sm_75", host_emulation: bool = False
) -> ir.Module:
    t = I32 if bits == 32 else I64
    module = new_module(arch, host_emulation)
    fn = kernel_function(module, symbol, 1, N_PTRS, N_TAIL, t)
    total, out, src, ids, flag, n, size, inner, first, step = fn.args[: 1 + N_PTRS + N_TAIL]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    _BODIES[spec.kind](b, spec, t, total, out, src, ids, flag, n, size, inner, first, step)
    b.ret_void()
    return module


def index_ptx_ir(spec: IndexSpec, bits: int = 32, arch: str = "sm_75") -> tuple[str, str]:
    """(LLVM IR text, symbol) for the GPU; the symbol hashes the IR."""
    return symbol_for(lambda sym: str(build_module(spec, sym, bits, arch)))


def index_host_emulation_ir(spec: IndexSpec, bits: int = 32) -> tuple[str, str]:
    """The GPU kernel built for the host, the special registers as trailing i32 arguments
    (llvm_ptx.host_emulation_ir): tests run the GPU code this way without a GPU."""
    return symbol_for(lambda sym: str(build_module(spec, sym, bits, host_emulation=True)))


def index_ptx(spec: IndexSpec, bits: int = 32, arch: str = "sm_75") -> PtxKernel:
    text, symbol = index_ptx_ir(spec, bits, arch)
    return PtxKernel(compile_ptx(text, arch), symbol, None, bits, "index")


__all__ = ["index_bits", "index_host_emulation_ir", "index_ptx", "index_ptx_ir"]
