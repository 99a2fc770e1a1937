"""LLVM IR for the fused attention kernel on the host (issue 33): one (batch index, query
block) task of FlashAttention's forward, the whole key loop in native code. The two block
products are calls through a cblas `sgemm` pointer (OpenBLAS, one thread: the caller's threads
run the tasks); the online softmax between them runs row by row over a block of scores that
stays in the core's cache, each row in two vectorized passes (bias and max; exp and sum) with
the polynomial exp of llvm/polymath.py.

    >>> kir = attention_ir(AttentionSpec(bias=True, causal=False, blas_int64=True))

ABI (f32; ld*: row strides in elements, every last dimension contiguous):
    void k(ptr q, ptr k, ptr v, ptr o, ptr bias, ptr qs, ptr s, ptr run_max, ptr run_sum,
           ptr sgemm, i64 rows, i64 n, i64 d, i64 e, i64 ldq, i64 ldk, i64 ldv, i64 ldo,
           i64 bias_row_stride, i64 q0, i64 key_block, float scale,
           ptr packed_k, ptr pack_a, ptr gemm, i32 gemm_flags)
q, o and bias point at the task's first query row; k and v at key 0; q0 is the task's first
query index (causal hides key j from query q0 + i where j > q0 + i); qs (rows x d), s (rows x
key_block), run_max and run_sum (rows) are the task's scratch. o is written whole.
With `AttentionSpec.own_qk`, Q Kᵀ runs through our GEMM (cpu/gemm_ir.py, its ABI) instead:
packed_k is the head's K packed once as B_PACKED panels of Kᵀ (gemm_runtime.pack_b_panels,
NR = the GEMM's; key_block a multiple of NR), pack_a the GEMM's packed-A scratch and
gemm_flags its layout flags; it stores the score block (no beta = 0 zeroing pass of C, and K
is not repacked for every query block as sgemm does). Otherwise these four are unused.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ..llvm.emitter import F32, I32, I64, REDUCE_FLAGS, Emitter
from ..llvm.loops import counted_loop, entry_alloca, i64
from ..llvm.symbols import symbol_for
from .llvm_cpu import CpuIR, has_avx512, mark_noalias, target_machine

PTR = ir.PointerType()
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # cblas enums
LOG2E = 1.4426950408889634
SHIFTER = 1.5 * 2.0**23  # x + SHIFTER rounds x to an integer held in the low mantissa bits
# 2**f on |f| <= 1/2: a degree-5 polynomial fitted for relative error (iteratively reweighted
# least squares at Chebyshev nodes), rounded to f32: max relative error 2.1e-7 (3.5 ulp), below
# the rounding of the block products that use the weights; two FMAs fewer than Taylor's
# degree 7 in a pass bound by its arithmetic
EXP2_POLY = (
    0.001303739845752716,
    0.009672075510025024,
    0.0555139034986496,
    0.24022194743156433,
    0.6931465864181519,
    1.0,
)


def exp2_nonpositive(em: Emitter, x):
    """2**x for x <= 0 or NaN (a score minus its row's maximum, in base 2): 0 below -126, where
    a weight is under 2**-126 of the row's largest (1) and cannot change its sum; no overflow
    and no subnormal cases, so no clamps and a single exponent construction (half the work of
    polymath.exp, which the softmax pass is bound by)."""
    b = em.b
    t = em.fadd(x, ir.Constant(F32, SHIFTER))
    n = em.fsub(t, ir.Constant(F32, SHIFTER))
    p = em.horner(em.fsub(x, n), EXP2_POLY)
    bits = b.sub(b.bitcast(t, I32), ir.Constant(I32, 0x4B400000))  # n as an integer
    pow2 = b.bitcast(b.shl(b.add(bits, ir.Constant(I32, 127)), ir.Constant(I32, 23)), F32)
    return em.select(
        em.fcmp("<", x, ir.Constant(F32, -126.0)), ir.Constant(F32, 0.0), em.fmul(p, pow2)
    )


@dataclass(frozen=True)
class AttentionSpec:
    bias: bool  # a bias operand with contiguous keys (row stride an argument, 0: broadcast)
    causal: bool
    blas_int64: bool  # the sgemm takes 64-bit integers (OpenBLAS built with INTERFACE64)
    own_qk: bool = False  # Q Kᵀ through our GEMM on a K packed once per head (s17: 165 vs 177 us)
    nr: int = 32  # the GEMM's panel width (packed_k's layout), with own_qk


def gemm_type(bint) -> ir.FunctionType:
    """cblas_sgemm's type with `bint` integers."""
    return ir.FunctionType(
        ir.VoidType(),
        [I32, I32, I32, bint, bint, bint, F32, PTR, bint, PTR, bint, F32, PTR, bint],
    )


def own_gemm_type() -> ir.FunctionType:
    """Our GEMM's type (cpu/gemm_ir.py's ABI)."""
    return ir.FunctionType(
        ir.VoidType(),
        [I64] * 5 + [PTR, I64, I64] * 2 + [PTR, I64, PTR, PTR, I32, PTR, PTR],
    )


class TaskOps:
    """The index arithmetic, loads and stores, and sgemm calls of the attention tasks' IR
    (forward, and attention_backward_ir.py's backward), on one builder."""

    def __init__(self, b: ir.IRBuilder, bint, gemm):
        self.b, self.bint, self.gemm = b, bint, gemm

    def at(self, ptr, idx):
        return self.b.gep(ptr, [idx], inbounds=True, source_etype=F32)

    def load(self, ptr, idx):
        return self.b.load(self.at(ptr, idx), typ=F32)

    def store(self, val, ptr, idx):
        self.b.store(val, self.at(ptr, idx))

    def mul(self, x, y):
        return self.b.mul(x, y, flags=("nsw",))

    def add(self, x, y):
        return self.b.add(x, y, flags=("nsw",))

    def smin(self, x, y):
        return self.b.select(self.b.icmp_signed("<", x, y), x, y)

    def smax(self, x, y):
        return self.b.select(self.b.icmp_signed(">", x, y), x, y)

    def cint(self, x):
        return self.b.trunc(x, self.bint) if self.bint is I32 else x

    def sgemm(self, ta, tb, m_, n_, k_, a, lda, bm, ldb, beta, cm, ldc):
        """C = A B + beta C, row-major, alpha 1."""
        c32, cint = (lambda x: ir.Constant(I32, x)), self.cint
        one = ir.Constant(F32, 1.0)
        self.b.call(
            self.gemm,
            [c32(ROW_MAJOR), c32(ta), c32(tb), cint(m_), cint(n_), cint(k_), one, a, cint(lda)]
            + [bm, cint(ldb), beta, cm, cint(ldc)],
        )


def _build(spec: AttentionSpec, symbol: str, triple: str, datalayout: str) -> str:
    module = ir.Module(name="dlvm_eq_attention")
    module.triple, module.data_layout = triple, datalayout
    bint = I64 if spec.blas_int64 else I32
    args = [PTR] * 9 + [gemm_type(bint).as_pointer()] + [I64] * 11 + [F32]
    args += [PTR, PTR, own_gemm_type().as_pointer(), I32]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), symbol)
    mark_noalias(fn, len(args))  # function attributes; the pointer arguments below
    for a in fn.args[:9]:
        a.add_attribute("noalias")
    q, k, v, o, bias, qs, s, run_max, run_sum, gemm = fn.args[:10]
    rows, n, d, e, ldq, ldk, ldv, ldo, brs, q0, kb = fn.args[10:21]
    scale = fn.args[21]
    packed_k, pack_a, own_gemm, gemm_flags = fn.args[22:26]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    em = Emitter(b, fast_ldexp=has_avx512())
    zero, one, ninf = (ir.Constant(F32, x) for x in (0.0, 1.0, float("-inf")))
    scale2 = em.fmul(scale, ir.Constant(F32, LOG2E))

    ops = TaskOps(b, bint, gemm)
    at, load, store, mul, add, smin, sgemm = (
        ops.at,
        ops.load,
        ops.store,
        ops.mul,
        ops.add,
        ops.smin,
        ops.sgemm,
    )

    i0 = i64(0)

    # o = 0, run_max = -inf, run_sum = 0, qs = q * scale
    def init_row(b, i):
        counted_loop(b, i0, e, lambda b, j: store(zero, o, add(mul(i, ldo), j)), "zo")
        counted_loop(
            b,
            i0,
            d,
            lambda b, j: store(
                em.fmul(load(q, add(mul(i, ldq), j)), scale2), qs, add(mul(i, d), j)
            ),
            "sq",
        )
        store(ninf, run_max, i)
        store(zero, run_sum, i)

    counted_loop(b, i0, rows, init_row, "init")
    kend = smin(n, add(q0, rows)) if spec.causal else n
    acc = entry_alloca(b, F32, "acc")

    def key_block(b, k0):
        kbl = smin(kb, b.sub(kend, k0))
        if spec.own_qk:  # s = qs Kᵀ[:, k0:k0+kbl]: panels from k0 / NR, each d * NR floats
            panels = at(packed_k, mul(b.sdiv(k0, i64(spec.nr)), mul(d, i64(spec.nr))))
            b.call(
                own_gemm,
                [i0, rows, i0, kbl, d, qs, d, i64(1), panels, i0, i0, s, kb, pack_a, pack_a]
                + [gemm_flags, ir.Constant(PTR, None), ir.Constant(PTR, None)],
            )
        else:
            sgemm(NO_TRANS, TRANS, rows, kbl, d, qs, d, at(k, mul(k0, ldk)), ldk, zero, s, kb)

        def row(b, i):
            base = mul(i, kb)
            if spec.causal:  # keys k0 + j with j <= q0 + i - k0 are visible
                vis = b.sub(add(add(q0, i), i64(1)), k0)
                jend = b.select(b.icmp_signed("<", vis, i0), i0, smin(vis, kbl))
            else:
                jend = kbl
            b.store(ninf, acc)

            def bias_max(b, j):
                x = load(s, add(base, j))
                if spec.bias:
                    bx = load(bias, add(mul(i, brs), add(k0, j)))
                    x = em.fadd(x, em.fmul(bx, ir.Constant(F32, LOG2E)))
                    store(x, s, add(base, j))
                b.store(em.intrinsic("maxnum", b.load(acc, typ=F32), x), acc)

            counted_loop(b, i0, jend, bias_max, "mx")
            old = load(run_max, i)
            new = em.intrinsic("maximum", old, b.load(acc, typ=F32))
            # rows that saw only hidden keys so far keep a finite shift (their weights are 0)
            finite = em.fcmp("<", em.intrinsic("fabs", new), ir.Constant(F32, float("inf")))
            shift = b.select(finite, new, zero)
            b.store(zero, acc)

            def exp_sum(b, j):
                p = exp2_nonpositive(em, em.fsub(load(s, add(base, j)), shift))
                store(p, s, add(base, j))
                b.store(em.fadd(b.load(acc, typ=F32), p, flags=REDUCE_FLAGS), acc)

            counted_loop(b, i0, jend, exp_sum, "ex")
            counted_loop(b, jend, kbl, lambda b, j: store(zero, s, add(base, j)), "hid")
            alpha = exp2_nonpositive(em, em.fsub(old, shift))  # 0 before any visible key
            store(em.fadd(em.fmul(load(run_sum, i), alpha), b.load(acc, typ=F32)), run_sum, i)
            store(new, run_max, i)
            ob = mul(i, ldo)
            with b.if_then(em.fcmp("u!=", alpha, one)):  # the row's maximum moved
                counted_loop(
                    b,
                    i0,
                    e,
                    lambda b, j: store(em.fmul(load(o, add(ob, j)), alpha), o, add(ob, j)),
                    "rs",
                )

        counted_loop(b, i0, rows, row, "row")
        sgemm(NO_TRANS, NO_TRANS, rows, e, kbl, s, kb, at(v, mul(k0, ldv)), ldv, one, o, ldo)

    counted_loop(b, i0, kend, key_block, "kb", step=kb)

    def finish(b, i):  # a row with every key hidden: 0/0 = NaN, as the naive formula
        total, ob = load(run_sum, i), mul(i, ldo)
        counted_loop(
            b, i0, e, lambda b, j: store(em.fdiv(load(o, add(ob, j)), total), o, add(ob, j)), "dv"
        )

    counted_loop(b, i0, rows, finish, "fin")
    b.ret_void()
    return str(module)


def task_ir(build, spec, kind: str) -> CpuIR:
    """The CpuIR of build(spec, symbol, triple, datalayout) for this host."""
    tm = target_machine()
    args = dict(triple=tm.triple, datalayout=str(tm.target_data))
    text, symbol = symbol_for(lambda sym: build(spec, sym, **args))
    return CpuIR(text, symbol, None, kind)


def attention_ir(spec: AttentionSpec) -> CpuIR:
    return task_ir(_build, spec, "attention")
