"""The fused attention backward on the CPU (issue 33): FlashAttention-2's, which never writes
the seq x seq probabilities. From q, k, v, the output o, its adjoint do and each score row's
log-sum-exp (the forward kernel's second output; recomputed here when absent), per (query
block, key block) pair:

    P = exp(q kᵀ s + bias - lse)    dV += Pᵀ dO    dP = dO vᵀ    dS = P * (dP - rowsum(dO * o))
    dK += dSᵀ q s                   dQ += dS k s

Tasks are (batch index, key block): each owns its dK and dV rows, and writes its share of dQ
into a buffer of its own; the shares are added in key-block order afterwards, by query block
(no float atomics, no order that depends on the thread count: bit-identical on any number of
threads). float32 runs each task natively (cpu/attention_backward_ir.py: the query loop, five
block products, each through our GEMM or OpenBLAS's cblas_sgemm on one thread as OURS says
(measured per product, see OURS), the exp and dS in vectorized passes; `native_backward`); other dtypes, a process without a cblas OpenBLAS and a non-finite
scalar bias run the same algorithm with numpy's calls per block. OpenBLAS runs on one thread
(the caller's threads run the tasks; attention_cpu.one_blas_thread). Memory: the dQ shares,
n / key block copies of dQ for a chunk of batch indices (at most SHARE_BYTES), two tiles of
scores per thread, and the operands packed for our GEMM (K twice and V: linear in n).

    attention_backward(q, k, v, bias, scale, causal, o, do, dq, dk, dv, lse=None)
"""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

from ...ir.attention_op import KEY_BLOCK, QUERY_BLOCK
from .attention_cpu import (
    attention_forward,
    one_blas_thread,
    own_qk_gemm,
    packed_keys,
    packed_row_blocks,
    row_view,
    sgemm_pointer,
)
from .cpu_count import usable_cpus
from .jit import JIT
from .threads import run_python

SHARE_BYTES = 32 << 20  # the dQ shares held at once (a chunk of batch indices)
LOG2E = 1.4426950408889634
_SCRATCH = threading.local()  # each thread's two score tiles (s, dp) and our GEMM's packing
# The products (cpu/attention_backward_ir.PRODUCTS: S, dV, dP, dK, dQ) that run through our GEMM
# where it applies (own_qk_gemm: key blocks of whole panels, DLVM_EQ_GEMM not 0), the rest on
# OpenBLAS: chosen per product by timing the whole backward with one product switched (one
# thread, shipped blocks, d 64; seq 1024 / 4096 against all-OpenBLAS): S 0.96x / 0.96x, dP
# 0.97x / 0.93x, dQ 0.97x / 0.95x, dV 1.03x / 1.01x, dK 1.02x / 0.98x; S + dP + dQ 0.91x /
# 0.89x, with dK too 0.93x / 0.89x (BENCHMARKS.md, s18-attnbwd).
OURS = (True, False, True, False, True)


def _flat_out(out, shape, dtype):
    """out itself as (batch, rows, cols) where it is contiguous (written in place), else a new
    array copied into it at the end."""
    if out is not None and out.dtype == dtype and out.flags.c_contiguous:
        return out.reshape(shape)
    return np.empty(shape, dtype)


def row_lse(q, k, v, bias, scale: float, causal: bool, threads: int = 0):
    """Each score row's log-sum-exp (batch + (m,)), through the forward kernel."""
    lse = np.empty(q.shape[:-1], q.dtype)
    out = np.empty(q.shape[:-1] + (v.shape[-1],), q.dtype)
    attention_forward(q, k, v, bias, scale, causal, out, threads, lse=lse)
    return lse


@functools.cache
def _native(blas_int64: bool, bias: bool, causal: bool, ours: tuple = (False,) * 5, nr: int = 32):
    """The compiled task for these flags (JIT's caches; the memo spares each call the key)."""
    from ..cpu.attention_backward_ir import AttentionBackwardSpec, attention_backward_ir

    spec = AttentionBackwardSpec(bias, causal, blas_int64, ours, nr)
    code = JIT.kernel("attention_backward", spec, lambda: attention_backward_ir(spec))
    args = [ctypes.c_void_p] * 14 + [ctypes.c_int64] * 14 + [ctypes.c_float] * 2
    args += [ctypes.c_void_p] * 5 + [ctypes.c_int32] * 5 + [ctypes.c_void_p] * 3
    return ctypes.CFUNCTYPE(None, *args)(code.address)


def _tiles(n: int, pack_a: int = 0, pack_b: int = 0):
    """Addresses of this thread's two score tiles of n floats and our GEMM's packing scratch
    (pack_a, pack_b floats; 0: none), kept across calls."""
    got = getattr(_SCRATCH, "bufs", None)
    key = (n, pack_a, pack_b)
    if got is None or got[0] != key:
        bufs = [np.empty(max(1, x), np.float32) for x in (n, n, pack_a, pack_b)]
        got = (key, *bufs, *(b.ctypes.data for b in bufs))
        _SCRATCH.bufs = got
    return got[5:]


ROWS_PER_PART = 512  # rows of dQ per task of add_shares


def run_tasks(task, b: int, chunk: int, key_blocks: int, causal: bool, share, dqf, sc, threads):
    """task(batch index, key block index, share slot) for every pair, chunk batch indices at a
    time (their dQ shares in `share`), each chunk's shares then added into dqf (None: dQ not
    wanted), OpenBLAS on one thread."""
    workers = threads or usable_cpus()
    with one_blas_thread():
        for c0 in range(0, b, chunk):
            ids = range(c0, min(b, c0 + chunk))
            tasks = [(bi, kbi, bi - c0) for bi in ids for kbi in range(key_blocks)]
            if causal:  # an early key block meets more queries: the longest first
                tasks.sort(key=lambda t: t[1])
            run_python(task, tasks, workers)
            if share is not None and dqf is not None:
                add_shares(share, dqf, c0, len(ids), sc, workers)


def add_shares(share, dqf, c0: int, count: int, scale, workers: int) -> None:
    """dqf[c0 + i] = scale * sum over key blocks of share[:, i] for i < count, added in
    key-block order (bit-identical on any number of threads), in tasks of ROWS_PER_PART rows."""
    m = share.shape[2]

    def part(i, r0):
        r1 = min(m, r0 + ROWS_PER_PART)
        acc = dqf[c0 + i, r0:r1]
        np.copyto(acc, share[0, i, r0:r1])
        for kbi in range(1, share.shape[0]):
            acc += share[kbi, i, r0:r1]
        acc *= scale

    run_python(part, [(i, r0) for i in range(count) for r0 in range(0, m, ROWS_PER_PART)], workers)


def _writable(a, shape):
    """a where the kernel can write it in place (float32, rows in whole elements), else a new
    array of `shape` (copied into a afterwards)."""
    if a is not None and a.dtype == np.float32 and row_view(a) is a:
        return a
    return np.empty(shape, np.float32)


def _own_args(ours, k, v, q, do, batch, blocks, d, e, kbls, lddo):
    """(our GEMM's per-task arguments as a function of (batch index, kbl), the packed
    operands, the scratch sizes, NR; the products it runs) for `ours` (a flag per product):
    nothing of ours where our GEMM does not apply (own_qk_gemm), or e = 0 (dP would have no
    depth). Every B operand of ours is packed here, once per call."""
    query_block, key_block = blocks
    own = own_qk_gemm(key_block, d) if e else None
    if own is None or not any(ours):
        return None, (False,) * 5
    from ..cpu.gemm_ir import B_PACKED  # llvmlite: imported on this path only

    nr = own.spec.nr
    packs = (
        packed_keys(k, batch, nr) if ours[0] else None,
        packed_keys(v, batch, nr) if ours[2] else None,
        packed_row_blocks(q, batch, nr, query_block) if ours[3] else None,
        packed_row_blocks(do, batch, nr, query_block) if ours[1] else None,
        packed_row_blocks(k, batch, nr, key_block) if ours[4] else None,
    )
    lay = own.layout_flags
    flags = {  # by kbl: the ragged last block's rows may collide in L1 where whole ones do not
        kbl: (
            lay("rows", d, False) | B_PACKED,
            lay("cols", kbl, False, True) | B_PACKED,
            lay("rows", lddo, False) | B_PACKED,
            lay("cols", kbl, False, True) | B_PACKED,
            B_PACKED,  # dS read in place: packing it (its 2 KiB rows collide) cost more
        )
        for kbl in kbls
    }
    lead = len(batch)
    heads = [(a.ctypes.data, a.strides[:lead]) if a is not None else (0, ()) for a in packs]

    def args(idx, kbl):
        p = [h + sum(i * st for i, st in zip(idx, sts)) if h else 0 for h, sts in heads]
        return (p[0], p[1], own.address, *flags[kbl], p[2], p[3], p[4])

    sizes = (own.spec.scratch(key_block)[0], 0)  # every B is packed: no packB scratch
    return (args, packs, sizes, nr), ours


def native_backward(
    q, k, v, bias, scale, causal, o, do, dq, dk, dv, lse, threads, blocks, ours=None
):
    """The float32 kernel; False where it does not apply (the caller runs numpy's). ours: a
    flag per product (cpu/attention_backward_ir.PRODUCTS) for our GEMM; None: OURS."""
    outs = [a for a in (dq, dk, dv) if a is not None]
    if not all(a.dtype == np.float32 for a in (q, k, v, o, do, lse, *outs)):
        return False
    gemm = sgemm_pointer()
    dense = isinstance(bias, np.ndarray) and bias.ndim > 0
    if gemm is None or (not dense and not np.isfinite(float(bias))):
        return False
    query_block, key_block = blocks
    m, d, n, e = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    batch = q.shape[:-2]
    b = int(np.prod(batch, dtype=np.int64))
    q, k, v, do = (row_view(a) for a in (q, k, v, do))
    qs = np.multiply(q, np.float32(scale * LOG2E), dtype=np.float32)  # contiguous
    lse2 = np.multiply(lse, np.float32(LOG2E), dtype=np.float32)
    rows_d = np.einsum("...ij,...ij->...i", do, o)  # D = rowsum(dO * O), contiguous
    cb2 = 0.0 if dense else float(bias) * LOG2E
    if dense:
        bias = np.broadcast_to(np.asarray(bias, np.float32), batch + (m, n))
        if bias.strides[-1] != 4:  # keys broadcast: the kernel reads them contiguous
            bias = np.ascontiguousarray(bias)
    dkw, dvw = _writable(dk, k.shape), _writable(dv, v.shape)
    dqw = dq if dq is None or (dq.dtype == np.float32 and dq.flags.c_contiguous) else None
    dqw = np.empty(q.shape, np.float32) if dq is not None and dqw is None else dqw
    arrays = [q, qs, k, v, do, lse2, rows_d, dkw, dvw] + ([bias] if dense else [])
    base = [a.ctypes.data for a in arrays]  # addresses by arithmetic: .ctypes costs ~2 us each
    lead = [a.strides[: len(batch)] for a in arrays]
    ld = [a.strides[-1 - 1] // 4 if a.ndim > len(batch) + 1 else 0 for a in arrays]
    brs = ld[9] if dense else 0
    key_blocks = list(range(0, n, key_block))
    per = len(key_blocks) * m * d * 4
    chunk = max(1, min(b, SHARE_BYTES // max(per, 1)))
    share = np.empty((len(key_blocks), chunk, m, d), np.float32) if dq is not None else None
    kbls = {min(n, k0 + key_block) - k0 for k0 in key_blocks}
    chosen = OURS if ours is None else tuple(ours)
    own, ours = _own_args(chosen, k, v, q, do, batch, blocks, d, e, kbls, ld[4])
    fn = _native(gemm[1], dense, causal, ours, own[3] if own else 32)
    tile = query_block * min(key_block, n)
    pack_a, pack_b = own[2] if own else (0, 0)
    idxs = list(np.ndindex(batch))

    def task(bi, kbi, slot):
        idx = idxs[bi]
        at = [p + sum(i * st for i, st in zip(idx, sts)) for p, sts in zip(base, lead)]
        k0 = key_blocks[kbi]
        kbl = min(n, k0 + key_block) - k0
        s_buf, dp_buf, pa, pb = _tiles(tile, pack_a, pack_b)
        sh = share[kbi, slot].ctypes.data if share is not None else 0
        mine = own[0](idx, kbl) if own else (0,) * 11
        fn(
            at[0], at[1], at[2] + k0 * ld[2] * 4, at[3] + k0 * ld[3] * 4, at[4],
            at[9] + k0 * 4 if dense else 0, at[5], at[6],
            at[7] + k0 * ld[7] * 4, at[8] + k0 * ld[8] * 4, sh, s_buf, dp_buf, gemm[0],
            m, kbl, d, e, ld[0], ld[2], ld[3], ld[4], brs, ld[7], ld[8], k0, query_block,
            int(share is not None), float(scale), cb2, mine[0], mine[1], pa, pb, *mine[2:],
        )  # fmt: skip

    dqf = dqw.reshape((b, m, d)) if dqw is not None else None
    run_tasks(task, b, chunk, len(key_blocks), causal, share, dqf, np.float32(scale), threads)
    for want, got in ((dq, dqw), (dk, dkw), (dv, dvw)):
        if want is not None and got is not want:
            want[...] = got
    return True


def attention_backward(
    q,
    k,
    v,
    bias,
    scale: float,
    causal: bool,
    o,
    do,
    dq,
    dk,
    dv,
    lse=None,
    threads: int = 0,
    blocks: tuple[int, int] = (QUERY_BLOCK, KEY_BLOCK),
) -> None:
    """dq, dk, dv: arrays of q's, k's and v's shapes, written whole (None: not wanted). bias: an
    array broadcastable to the scores' shape, or a float (0: none); it gets no adjoint."""
    query_block, key_block = blocks
    dt = q.dtype.type
    m, d, n, e = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    batch = q.shape[:-2]
    if n == 0 or m == 0 or d == 0:
        for a, src in ((dq, q), (dk, k), (dv, v)):
            if a is not None:
                a[...] = 0
        return
    if lse is None:
        lse = row_lse(q, k, v, bias, scale, causal, threads)
    if native_backward(q, k, v, bias, scale, causal, o, do, dq, dk, dv, lse, threads, blocks):
        return
    dense = isinstance(bias, np.ndarray) and bias.ndim > 0
    b = int(np.prod(batch, dtype=np.int64))
    flat = [np.reshape(a, (b,) + a.shape[-2:]) for a in (q, k, v, o, do)]
    qf, kf, vf, of, dof = flat
    lf = np.reshape(lse, (b, m))
    biasf = np.reshape(np.broadcast_to(bias, batch + (m, n)), (b, m, n)) if dense else None
    cb = dt(float(bias)) if not dense else None
    # D = rowsum(dO * O): the probabilities' part of dP's row sums (FlashAttention-2)
    rows_d = np.einsum("bij,bij->bi", dof, of)
    key_blocks = list(range(0, n, key_block))
    # the dQ shares of a chunk of batch indices at a time: at most SHARE_BYTES of them
    per = len(key_blocks) * m * d * q.dtype.itemsize
    chunk = max(1, min(b, SHARE_BYTES // max(per, 1)))
    share = np.empty((len(key_blocks), chunk, m, d), q.dtype)
    dqf, dkf, dvf = (
        _flat_out(a, (b,) + a_shape, q.dtype) if want else None
        for a, a_shape, want in (
            (dq, (m, d), dq is not None),
            (dk, (n, d), True),
            (dv, (n, e), True),
        )
    )
    sc = dt(scale)

    def task(bi, kbi, slot):
        k0 = key_blocks[kbi]
        k1 = min(n, k0 + key_block)
        kb, vb = kf[bi, k0:k1], vf[bi, k0:k1]
        qi, doi, li, di = qf[bi], dof[bi], lf[bi], rows_d[bi]
        dkb = np.zeros((k1 - k0, d), q.dtype)
        dvb = np.zeros((k1 - k0, e), q.dtype)
        mine = share[kbi, slot]
        first = (k0 // query_block) * query_block if causal else 0  # earlier queries see none
        mine[:first] = 0
        for q0 in range(first, m, query_block):
            q1 = min(m, q0 + query_block)
            s = (qi[q0:q1] * sc) @ kb.T
            if dense:
                s += biasf[bi, q0:q1, k0:k1]
            elif cb:
                s += cb
            s -= li[q0:q1, None]
            if causal and k1 - 1 > q0:  # the block reaches above the diagonal
                s[np.arange(k0, k1)[None, :] > np.arange(q0, q1)[:, None]] = -np.inf
            p = np.exp(s, out=s)
            dvb += p.T @ doi[q0:q1]
            dp = doi[q0:q1] @ vb.T
            dp -= di[q0:q1, None]
            dp *= p  # dS
            dkb += dp.T @ qi[q0:q1]
            np.matmul(dp, kb, out=mine[q0:q1])
        dkb *= sc
        dkf[bi, k0:k1] = dkb
        dvf[bi, k0:k1] = dvb

    run_tasks(task, b, chunk, len(key_blocks), causal, share, dqf, sc, threads)
    for want, got in ((dq, dqf), (dk, dkf), (dv, dvf)):
        if want is not None and not np.shares_memory(want, got):
            want[...] = np.reshape(got, want.shape)
