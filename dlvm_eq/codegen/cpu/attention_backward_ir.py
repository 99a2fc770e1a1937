"""LLVM IR for the fused attention backward on the host (issue 33): one (batch index, key
block) task of FlashAttention-2's backward, the whole query loop in native code. Per query tile
of `qb` rows, five block products through the cblas `sgemm` pointer (OpenBLAS, one thread: the
caller's threads run the tasks) and two vectorized passes over the tile's scores, which stay
in the core's cache (attention_ir.exp2_nonpositive for the exp):

    S = qs kbᵀ                      (qs = q · scale · log2 e: the scores in base 2)
    P = 2^(S + bias · log2 e - lse2)      (lse2: each row's log-sum-exp in base 2; hidden: 0)
    dv += Pᵀ dO      dP = dO vbᵀ      dS = P ⊙ (dP - D)      dk += dSᵀ q      share = dS kb

D is rowsum(dO ⊙ O); dk is scaled by `scale` at the end; the caller adds the tasks' dQ shares
in key-block order and scales them (runtime/attention_backward.py).

    >>> kir = attention_backward_ir(AttentionBackwardSpec(bias=True, causal=False, blas_int64=True))

ABI (f32; ld*: row strides in elements, every last dimension contiguous):
    void k(ptr q, ptr qs, ptr k, ptr v, ptr do, ptr bias, ptr lse2, ptr rows_d, ptr dk, ptr dv,
           ptr share, ptr s, ptr dp, ptr sgemm, i64 m, i64 kbl, i64 d, i64 e, i64 ldq, i64 ldk,
           i64 ldv, i64 lddo, i64 bias_row_stride, i64 lddk, i64 lddv, i64 k0, i64 qb,
           i64 want_dq, float scale, float const_bias2, ptr packed_k, ptr packed_v, ptr pack_a,
           ptr pack_b, ptr gemm, i32 flags_s, i32 flags_dv, i32 flags_dp, i32 flags_dk,
           i32 flags_dq, ptr packed_q, ptr packed_do, ptr packed_kb)
q, qs (m x d, contiguous), do, lse2 and rows_d point at the batch index's row 0; k, v, dk and
dv at the block's first key (k0); bias at (row 0, key k0). share (m x d, contiguous) receives
the task's dS kb for every row (0 where no query of a row sees the block). s and dp (qb x kbl,
row stride kbl) are the task's scratch. const_bias2: a scalar bias times log2 e (0: none).
Each of the five products named in `AttentionBackwardSpec.ours` runs through our GEMM
(cpu/gemm_ir.py's ABI, `gemm`, with its layout flags flags_*) instead of sgemm: S on the head's
K and dP on its V packed once per call as B_PACKED panels (runtime/attention_cpu.packed_keys;
packed_k and packed_v point at the head's panel 0, the task reads from k0 / NR on, so k0 and the
key block are whole panels); dV, dK and dQ on B operands packed once per call by blocks of rows
(attention_cpu.packed_row_blocks: dO and q by query tiles of qb rows, k by key blocks; each
points at the head's row 0); pack_a is the GEMM's packed-A scratch, pack_b unused. Unused
pointers may be null.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ..llvm.emitter import F32, I32, I64, Emitter
from ..llvm.loops import counted_loop, i64
from .attention_ir import (
    LOG2E,
    NO_TRANS,
    TRANS,
    TaskOps,
    exp2_nonpositive,
    gemm_type,
    own_gemm_type,
    task_ir,
)
from .llvm_cpu import CpuIR, has_avx512, mark_noalias

PTR = ir.PointerType()
N_PTRS = 13  # the array pointers before the sgemm pointer


@dataclass(frozen=True)
class AttentionBackwardSpec:
    bias: bool  # a bias operand with contiguous keys (row stride an argument, 0: broadcast)
    causal: bool
    blas_int64: bool  # the sgemm takes 64-bit integers (OpenBLAS built with INTERFACE64)
    # which products run through our GEMM, in PRODUCTS' order (the others call sgemm)
    ours: tuple[bool, bool, bool, bool, bool] = (False,) * 5
    nr: int = 32  # our GEMM's panel width (packed_k's and packed_v's layout)


PRODUCTS = ("s", "dv", "dp", "dk", "dq")  # S = qs kbᵀ, dv += Pᵀ dO, dP = dO vᵀ, dk += dSᵀ q, dS kb
N_ARGS = 42  # the task's arguments


def _build(spec: AttentionBackwardSpec, symbol: str, triple: str, datalayout: str) -> str:
    module = ir.Module(name="dlvm_eq_attention_backward")
    module.triple, module.data_layout = triple, datalayout
    bint = I64 if spec.blas_int64 else I32
    args = [PTR] * N_PTRS + [gemm_type(bint).as_pointer()] + [I64] * 14 + [F32, F32]
    args += [PTR] * 4 + [own_gemm_type().as_pointer()] + [I32] * len(PRODUCTS) + [PTR] * 3
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), symbol)
    mark_noalias(fn, len(args))
    for a in fn.args[:N_PTRS]:
        a.add_attribute("noalias")
    q, qs, k, v, do, bias, lse2, rows_d, dk, dv, share, s, dp = fn.args[:N_PTRS]
    gemm = fn.args[N_PTRS]
    m, kbl, d, e, ldq, ldk, ldv, lddo, brs, lddk, lddv, k0, qb, want_dq = fn.args[14:28]
    scale, const_bias2 = fn.args[28:30]
    packed_k, packed_v, pack_a, pack_b, own_gemm = fn.args[30:35]
    flags = dict(zip(PRODUCTS, fn.args[35:40]))
    packed_q, packed_do, packed_kb = fn.args[40:43]
    ours = dict(zip(PRODUCTS, spec.ours))
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    em = Emitter(b, fast_ldexp=has_avx512())
    zero, one = ir.Constant(F32, 0.0), ir.Constant(F32, 1.0)
    i0 = i64(0)

    ops = TaskOps(b, bint, gemm)
    at, load, store, mul, add, smin, smax, sgemm = (
        ops.at,
        ops.load,
        ops.store,
        ops.mul,
        ops.add,
        ops.smin,
        ops.smax,
        ops.sgemm,
    )

    null = ir.Constant(PTR, None)

    def own(name, m_, n_, k_, a, rs_a, cs_a, bm, rs_b, cs_b, c, ldc):
        """C (+)= A B through our GEMM (whether it adds: ACCUMULATE in flags[name])."""
        b.call(
            own_gemm,
            [i0, m_, i0, n_, k_, a, rs_a, cs_a, bm, rs_b, cs_b, c, ldc, pack_a, pack_b]
            + [flags[name], null, null],
        )

    def width(cols):  # cols rounded up to whole panels: a packed row block's row width
        return mul(b.sdiv(add(cols, i64(spec.nr - 1)), i64(spec.nr)), i64(spec.nr))

    def panels(packed, depth):  # the block's panels of a head packed from key 0: k0 / NR on
        return at(packed, mul(b.sdiv(k0, i64(spec.nr)), mul(depth, i64(spec.nr))))

    def zero_rows(ptr, ld, nrows, ncols, name):
        def row(b, i):
            base = mul(i, ld)
            counted_loop(b, i0, ncols, lambda b, j: store(zero, ptr, add(base, j)), name + "c")

        counted_loop(b, i0, nrows, row, name)

    zero_rows(dk, lddk, kbl, d, "zk")
    zero_rows(dv, lddv, kbl, e, "zv")
    # queries before k0 see none of the block's keys under the causal mask (top-left aligned):
    # tiles from the one holding k0, whole multiples of qb (the packed row blocks' starts)
    first = smin(mul(b.sdiv(k0, qb), qb), m) if spec.causal else i0
    with b.if_then(b.icmp_signed("!=", want_dq, i0)):
        zero_rows(share, d, first, d, "zs")

    def tile(b, q0):
        rows = smin(qb, b.sub(m, q0))
        one_i = i64(1)
        if ours["s"]:  # stored, not added: no beta = 0 pass
            own(
                "s", rows, kbl, d, at(qs, mul(q0, d)), d, one_i, panels(packed_k, d), i0, i0, s, kbl
            )
        else:
            sgemm(NO_TRANS, TRANS, rows, kbl, d, at(qs, mul(q0, d)), d, k, ldk, zero, s, kbl)

        def prob_row(b, i):  # P = 2^(S + bias - lse2); hidden keys 0
            qi = add(q0, i)
            base = mul(i, kbl)
            shift = em.fsub(load(lse2, qi), const_bias2)
            if spec.causal:  # keys k0 + j with j <= q0 + i - k0 are visible
                jend = smin(smax(b.sub(add(qi, i64(1)), k0), i0), kbl)
            else:
                jend = kbl

            def prob(b, j):
                x = load(s, add(base, j))
                if spec.bias:
                    bx = load(bias, add(mul(qi, brs), j))
                    x = em.fadd(x, em.fmul(bx, ir.Constant(F32, LOG2E)))
                store(exp2_nonpositive(em, em.fsub(x, shift)), s, add(base, j))

            counted_loop(b, i0, jend, prob, "pr")
            counted_loop(b, jend, kbl, lambda b, j: store(zero, s, add(base, j)), "hid")

        counted_loop(b, i0, rows, prob_row, "prow")
        do_t = at(do, mul(q0, lddo))
        if ours["dv"]:  # dv += Pᵀ dO (Pᵀ: columns contiguous)
            pdo = at(packed_do, mul(q0, width(e)))
            own("dv", kbl, e, rows, s, one_i, kbl, pdo, i0, i0, dv, lddv)
        else:
            sgemm(TRANS, NO_TRANS, kbl, e, rows, s, kbl, do_t, lddo, one, dv, lddv)
        if ours["dp"]:  # dP = dO vᵀ on V packed once
            own("dp", rows, kbl, e, do_t, lddo, one_i, panels(packed_v, e), i0, i0, dp, kbl)
        else:
            sgemm(NO_TRANS, TRANS, rows, kbl, e, do_t, lddo, v, ldv, zero, dp, kbl)

        def ds_row(b, i):  # dS = P (dP - D)
            base = mul(i, kbl)
            di = load(rows_d, add(q0, i))

            def ds(b, j):
                x = em.fmul(load(s, add(base, j)), em.fsub(load(dp, add(base, j)), di))
                store(x, dp, add(base, j))

            counted_loop(b, i0, kbl, ds, "ds")

        counted_loop(b, i0, rows, ds_row, "dsrow")
        q_t = at(q, mul(q0, ldq))
        if ours["dk"]:  # dk += dSᵀ q
            pq = at(packed_q, mul(q0, width(d)))
            own("dk", kbl, d, rows, dp, one_i, kbl, pq, i0, i0, dk, lddk)
        else:
            sgemm(TRANS, NO_TRANS, kbl, d, rows, dp, kbl, q_t, ldq, one, dk, lddk)
        with b.if_then(b.icmp_signed("!=", want_dq, i0)):  # share = dS kb
            sh = at(share, mul(q0, d))
            if ours["dq"]:
                pkb = at(packed_kb, mul(k0, width(d)))
                own("dq", rows, d, kbl, dp, kbl, one_i, pkb, i0, i0, sh, d)
            else:
                sgemm(NO_TRANS, NO_TRANS, rows, d, kbl, dp, kbl, k, ldk, zero, sh, d)

    counted_loop(b, first, m, tile, "tile", step=qb)

    def scale_row(b, i):
        base = mul(i, lddk)
        counted_loop(
            b,
            i0,
            d,
            lambda b, j: store(em.fmul(load(dk, add(base, j)), scale), dk, add(base, j)),
            "sk",
        )

    counted_loop(b, i0, kbl, scale_row, "skr")
    b.ret_void()
    return str(module)


def attention_backward_ir(spec: AttentionBackwardSpec) -> CpuIR:
    return task_ir(_build, spec, "attention_backward")
