"""`attention` on sympy, computed the way the fused kernel computes it: FlashAttention's online
softmax over key blocks (a running maximum, a running sum and a running weighted sum of v, each
rescaled by exp(old max - new max) when a block raises the maximum). verify-rules then proves
rules/attention.egg's rewrites from the naive softmax(q kᵀ s + bias) v to `Attention` as
identities between the two computations (the online-softmax lemma, on every small shape).
`attentionBackward` is FlashAttention-2's backward (probabilities from the row log-sum-exp,
D = rowsum(g * o)), so rules/attention_adjoint.egg's fused adjoint is proved against the
vector-Jacobian product of the naive program.

    attention_table(as_array, extremum)["attention"]([q, k, v, bias], attrs, rtype)
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from ..ir.attention_op import causal_mask

BLOCK = 2  # keys per block: two blocks already exercise the rescaling of the first


def online_softmax_row(scores: list, values: list, extremum, block: int = BLOCK):
    """sum_j softmax(scores)_j values_j by blocks of keys; values are tuples (one per output
    column). The running max starts at the first block's, so no -oo enters the sums."""
    m = lsum = acc = None
    for lo in range(0, len(scores), block):
        s, vals = scores[lo : lo + block], values[lo : lo + block]
        m_blk = extremum(sp.Max, s)
        w = [sp.exp(x - m_blk) for x in s]  # this block's weights against its own maximum
        l_blk = sp.Add(*w)
        acc_blk = [sp.Add(*(wj * vj[c] for wj, vj in zip(w, vals))) for c in range(len(vals[0]))]
        if m is None:
            m, lsum, acc = m_blk, l_blk, acc_blk
            continue
        new = extremum(sp.Max, [m, m_blk])
        old_scale, blk_scale = sp.exp(m - new), sp.exp(m_blk - new)
        lsum = lsum * old_scale + l_blk * blk_scale
        acc = [a * old_scale + b * blk_scale for a, b in zip(acc, acc_blk)]
        m = new
    return [a / lsum for a in acc]


def attention_table(as_array, extremum) -> dict:
    def attention(args, attrs, rtype):
        q, k, v, bias = (as_array(a) for a in args)
        scale = sp.Rational(float(attrs["scale"]))  # exact, as the Const it came from
        m, n = q.shape[-2], k.shape[-2]
        bias = np.broadcast_to(bias, q.shape[:-1] + (n,))
        hidden = causal_mask(m, n) if attrs.get("causal", 0) else np.zeros((m, n), bool)
        out = np.empty(rtype.shape, dtype=object)
        for idx in np.ndindex(q.shape[:-2]):
            qb, kb, vb, bb = q[idx], k[idx], v[idx], bias[idx]
            for i in range(m):
                seen = [j for j in range(n) if not hidden[i, j]]
                # a -oo bias (verify/rules.py's causal_bias_value) hides its key: weight 0
                finite = [j for j in seen if bb[i, j] != -sp.oo]
                seen = finite or seen
                scores = [
                    sp.Add(*(qb[i, c] * kb[j, c] for c in range(q.shape[-1]))) * scale + bb[i, j]
                    for j in seen
                ]
                row = online_softmax_row(scores, [tuple(vb[j]) for j in seen], extremum)
                out[idx + (i,)] = row
        return out

    def attention_backward(args, attrs, rtype):
        """FlashAttention-2's backward as the kernel computes it: the probabilities from the row
        log-sum-exp, D = rowsum(g * o) from the given output o."""
        q, k, v, bias, o, g = (as_array(a) for a in args)
        scale = sp.Rational(float(attrs["scale"]))
        m, n, wrt = q.shape[-2], k.shape[-2], attrs["wrt"]
        bias = np.broadcast_to(bias, q.shape[:-1] + (n,))
        hidden = causal_mask(m, n) if attrs.get("causal", 0) else np.zeros((m, n), bool)
        out = np.full(rtype.shape, sp.Integer(0), dtype=object)
        for idx in np.ndindex(q.shape[:-2]):
            qb, kb, vb, bb, ob, gb = q[idx], k[idx], v[idx], bias[idx], o[idx], g[idx]
            for i in range(m):
                seen = [j for j in range(n) if not hidden[i, j] and bb[i, j] != -sp.oo]
                x = {
                    j: sp.Add(*(qb[i, c] * kb[j, c] for c in range(q.shape[-1]))) * scale + bb[i, j]
                    for j in seen
                }
                lse = sp.log(sp.Add(*(sp.exp(x[j]) for j in seen)))
                rows = sp.Add(*(gb[i, c] * ob[i, c] for c in range(v.shape[-1])))
                for j in seen:
                    p = sp.exp(x[j] - lse)
                    if wrt == 2:
                        for c in range(v.shape[-1]):
                            out[idx + (j, c)] += p * gb[i, c]
                        continue
                    dp = sp.Add(*(gb[i, c] * vb[j, c] for c in range(v.shape[-1])))
                    ds = p * (dp - rows) * scale
                    for c in range(q.shape[-1]):
                        if wrt == 0:
                            out[idx + (i, c)] += ds * kb[j, c]
                        else:
                            out[idx + (j, c)] += ds * qb[i, c]
        return out

    return {"attention": attention, "attentionBackward": attention_backward}
