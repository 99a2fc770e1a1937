"""FlashAttention-2's backward as two PTX kernels (the CPU's is cpu/attention_backward_ir.py):
the scores are recomputed from q, k and each row's log-sum-exp, never stored.

- "dq": a thread per query row i, k and v tiles in shared memory (the forward's layout):
      D_i = rowsum(dO_i * O_i); for each key j: P = exp(s_ij - lse_i), dP = dO_i . v_j,
      dQ_i += P (dP - D_i) k_j; then dQ_i *= scale. Writes dQ and D.
  .entry k(ptr dq, ptr delta, ptr q, ptr k, ptr v, ptr bias, ptr o, ptr g, ptr lse)
- "dkv": a thread per key row j, tiles of queries (q, dO, lse and D rows) in shared memory:
      for each query i: dV_j += P dO_i, dK_j += P (dO_i . v_j - D_i) q_i; then dK_j *= scale.
  .entry k(ptr dk, ptr dv, ptr q, ptr k, ptr v, ptr bias, ptr g, ptr lse, ptr delta)
  Under causal a key block's CTA starts at its first key's query (earlier queries see none).

Each output row is written by its own thread once: no atomics, and the sums run in a fixed
order (results do not depend on the grid). "dkv" reads "dq"'s D, so "dq" is launched first.
The semantics are the reference's (ir/attention_op.attention_backward): a score is
q.k scale + bias, -inf where causal hides it; a row whose every key is hidden (lse = -inf)
gives NaN weights, as the naive formula does.

    >>> text, symbol = attention_ptx_ir(dataclasses.replace(spec, kernel="dq"), "sm_80")
"""

from __future__ import annotations

from ..llvm.loops import counted_loop, entry_alloca
from ..llvm.polymath import exp
from .attention_ptx import AttentionKernel


def _end(b, c, start, step: int, limit: int):
    """min(start + step, limit)."""
    end = b.add(start, c(step))
    return b.select(b.icmp_unsigned("<", end, c(limit)), end, c(limit))


class DqKernel(AttentionKernel):
    pointers = 9

    def emit(self) -> None:
        s, b, e, c = self.spec, self.b, self.e, self.c
        dq, delta, q, k, v, bias, o, g, lse = self.fn.args[:9]
        d, ev, n, m, bk = s.d, s.e, s.n, s.m, self.bk
        bh, q0, row, valid = self.owned_row()
        k_end = _end(b, c, q0, s.query_block, m) if s.causal else c(n)
        if s.causal:
            k_end = b.select(b.icmp_unsigned("<", k_end, c(n)), k_end, c(n))
        qrow, grow, acc = (self.private(w, name) for w, name in ((d, "q"), (ev, "g"), (d, "dq")))
        at = b.add(b.mul(bh, c(m)), row)
        d_i, l_i = entry_alloca(b, self.T, "D"), entry_alloca(b, self.T, "lse")
        bias_row = self.bias_row(bh, row)
        with b.if_then(valid):
            for dst, src, w in ((qrow, q, d), (grow, g, ev)):
                base = b.mul(at, c(w))
                self.each(w, lambda b, j, dst=dst, src=src, base=base: self.store(
                        self.load(src, b.add(base, j)), dst, j
                    ), "row"
                )  # fmt: skip
            self.each(d, lambda b, j: self.store(self.f(0.0), acc, j), "zero")
            b.store(self.dot(grow, c(0), o, b.mul(at, c(ev)), ev), d_i)
            self.store(b.load(d_i, typ=self.T), delta, at)
            b.store(self.load(lse, at), l_i)

        def tile(b, k0):
            kt = b.sub(_end(b, c, k0, bk, n), k0)
            self.barrier()
            self.fill(k, b.mul(b.add(b.mul(bh, c(n)), k0), c(d)), b.mul(kt, c(d)), 0)
            self.fill(v, b.mul(b.add(b.mul(bh, c(n)), k0), c(ev)), b.mul(kt, c(ev)), bk * d)
            self.barrier()
            with b.if_then(valid):

                def key(b, j):
                    raw = self.dot(qrow, c(0), self.shared, b.mul(j, c(d)), d)
                    x = self.score(e.fmul(raw, self.f(s.scale)), bias, bias_row, row, b.add(k0, j))
                    p = exp(e, e.fsub(x, b.load(l_i, typ=self.T)))
                    dp = self.dot(grow, c(0), self.shared, b.add(c(bk * d), b.mul(j, c(ev))), ev)
                    ds = e.fmul(p, e.fsub(dp, b.load(d_i, typ=self.T)))
                    self.axpy(acc, ds, self.shared, b.mul(j, c(d)), d)

                counted_loop(b, c(0), kt, key, "key")

        counted_loop(b, c(0), k_end, tile, "tile", step=c(bk))
        with b.if_then(valid):
            base = b.mul(at, c(d))
            self.each(d, lambda b, j: self.store(
                    e.fmul(self.load(acc, j), self.f(s.scale)), dq, b.add(base, j)
                ), "out"
            )  # fmt: skip
        b.ret_void()


class DkvKernel(AttentionKernel):
    pointers = 9

    def emit(self) -> None:
        s, b, e, c = self.spec, self.b, self.e, self.c
        dk, dv, q, k, v, bias, g, lse, delta = self.fn.args[:9]
        d, ev, n, m, bt = s.d, s.e, s.n, s.m, self.bk
        bh, k0, key, valid = self.owned_row()
        krow, vrow = self.private(d, "k"), self.private(ev, "v")
        dk_acc, dv_acc = self.private(d, "dk"), self.private(ev, "dv")
        at = b.add(b.mul(bh, c(n)), key)
        with b.if_then(valid):
            for dst, src, w in ((krow, k, d), (vrow, v, ev)):
                base = b.mul(at, c(w))
                self.each(w, lambda b, j, dst=dst, src=src, base=base: self.store(
                        self.load(src, b.add(base, j)), dst, j
                    ), "row"
                )  # fmt: skip
            for acc, w in ((dk_acc, d), (dv_acc, ev)):
                self.each(w, lambda b, j, acc=acc: self.store(self.f(0.0), acc, j), "zero")
        # shared tile: q rows, dO rows, lse, D
        g_at, l_at, d_at = bt * d, bt * (d + ev), bt * (d + ev + 1)
        # under causal, queries before the block's first key see none of its keys
        start = b.select(b.icmp_unsigned("<", k0, c(m)), k0, c(m)) if s.causal else c(0)

        def tile(b, i0):
            qt = b.sub(_end(b, c, i0, bt, m), i0)
            rows = b.add(b.mul(bh, c(m)), i0)
            self.barrier()
            self.fill(q, b.mul(rows, c(d)), b.mul(qt, c(d)), 0)
            self.fill(g, b.mul(rows, c(ev)), b.mul(qt, c(ev)), g_at)
            self.fill(lse, rows, qt, l_at)
            self.fill(delta, rows, qt, d_at)
            self.barrier()
            with b.if_then(valid):

                def query(b, i):
                    qi = b.add(i0, i)
                    raw = self.dot(krow, c(0), self.shared, b.mul(i, c(d)), d)
                    x = self.score(
                        e.fmul(raw, self.f(s.scale)), bias, self.bias_row(bh, qi), qi, key
                    )
                    p = exp(e, e.fsub(x, self.load(self.shared, b.add(c(l_at), i))))
                    g_row = b.add(c(g_at), b.mul(i, c(ev)))
                    self.axpy(dv_acc, p, self.shared, g_row, ev)
                    dp = self.dot(vrow, c(0), self.shared, g_row, ev)
                    ds = e.fmul(p, e.fsub(dp, self.load(self.shared, b.add(c(d_at), i))))
                    self.axpy(dk_acc, ds, self.shared, b.mul(i, c(d)), d)

                counted_loop(b, c(0), qt, query, "query")

        counted_loop(b, start, c(m), tile, "tile", step=c(bt))
        with b.if_then(valid):
            for dst, acc, w, sc in ((dk, dk_acc, d, s.scale), (dv, dv_acc, ev, 1.0)):
                base = b.mul(at, c(w))
                self.each(w, lambda b, j, dst=dst, acc=acc, base=base, sc=sc: self.store(
                        e.fmul(self.load(acc, j), self.f(sc)), dst, b.add(base, j)
                    ), "out"
                )  # fmt: skip
        b.ret_void()


BACKWARD_KERNELS = {"dq": DqKernel, "dkv": DkvKernel}
