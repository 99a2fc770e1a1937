"""The fused attention backward on the CPU (issue 33): FlashAttention-2's, which never writes
the seq x seq probabilities. From q, k, v, the output o, its adjoint do and each score row's
log-sum-exp (the forward kernel's second output; recomputed here when absent), per (query
block, key block) pair:

    P = exp(q kᵀ s + bias - lse)    dV += Pᵀ dO    dP = dO vᵀ    dS = P * (dP - rowsum(dO * o))
    dK += dSᵀ q s                   dQ += dS k s

Tasks are (batch index, key block): each owns its dK and dV rows, and writes its share of dQ
into a buffer of its own; the shares are added in key-block order afterwards, by query block
(no float atomics, no order that depends on the thread count: bit-identical on any number of
threads). Block products are numpy's calls to OpenBLAS on one thread (the caller's threads run
the tasks; attention_cpu.one_blas_thread). Memory: the dQ shares, n / key block copies of dQ
for a chunk of batch indices (at most SHARE_BYTES), and a block of scores per thread.

    attention_backward(q, k, v, bias, scale, causal, o, do, dq, dk, dv, lse=None)
"""

from __future__ import annotations

import numpy as np

from ...ir.attention_op import KEY_BLOCK, QUERY_BLOCK
from .attention_cpu import attention_forward, one_blas_thread
from .cpu_count import usable_cpus
from .threads import run_python

SHARE_BYTES = 32 << 20  # the dQ shares held at once (a chunk of batch indices)


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

    def combine(bi, slot, q0):  # the key blocks' shares, added in key-block order
        q1 = min(m, q0 + query_block)
        acc = share[0, slot, q0:q1].copy()
        for kbi in range(1, len(key_blocks)):
            acc += share[kbi, slot, q0:q1]
        acc *= sc
        dqf[bi, q0:q1] = acc

    workers = threads or usable_cpus()
    with one_blas_thread():
        for c0 in range(0, b, chunk):
            ids = range(c0, min(b, c0 + chunk))
            tasks = [(bi, kbi, bi - c0) for bi in ids for kbi in range(len(key_blocks))]
            if causal:  # an early key block meets more queries: the longest first
                tasks.sort(key=lambda t: t[1])
            run_python(task, tasks, workers)
            if dqf is not None:
                parts = [(bi, bi - c0, q0) for bi in ids for q0 in range(0, m, query_block)]
                run_python(combine, parts, workers)
    for want, got in ((dq, dqf), (dk, dkf), (dv, dvf)):
        if want is not None and not np.shares_memory(want, got):
            want[...] = np.reshape(got, want.shape)
