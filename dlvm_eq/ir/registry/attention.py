"""`attention` (issue 33): softmax(q kᵀ scale + bias) v as one op, which rules/attention.egg
derives from the naive program and codegen runs without writing the scores; its type rule and
interpreter are ir/attention_op.py's, its adjoints rules/attention_adjoint.egg's.

Its meaning on sympy arrays (for verify) is computed the way the fused kernel computes it:
FlashAttention's online softmax over key blocks (a running maximum, a running sum and a running
weighted sum of v, each rescaled by exp(old max - new max) when a block raises the maximum).
verify-rules then proves rules/attention.egg's rewrites from the naive softmax(q kᵀ s + bias) v
to `Attention` as identities between the two computations (the online-softmax lemma, on every
small shape).

Under vmap the batch is one more batch axis of q, k and v (unbatched ones broadcast to it); a
batched bias gets size-1 axes after the batch axis so that it still broadcasts to the scores.
"""

from __future__ import annotations

import numpy as np

from .. import attention_op
from ..op_spec import OpSpec

ATTENTION = "attention"  # a plan step of its own (codegen/planning/attention.py)
BLOCK = 2  # keys per block of the symbolic online softmax: two blocks rescale the first


def online_softmax_row(sv, scores: list, values: list, block: int = BLOCK):
    """sum_j softmax(scores)_j values_j by blocks of keys; values are tuples (one per output
    column). The running max starts at the first block's, so no -oo enters the sums."""
    sp = sv.sp
    m = lsum = None
    acc: list = []
    for lo in range(0, len(scores), block):
        s, vals = scores[lo : lo + block], values[lo : lo + block]
        m_blk = sv.extremum(sp.Max, s)
        w = [sp.exp(x - m_blk) for x in s]  # this block's weights against its own maximum
        l_blk = sp.Add(*w)
        acc_blk = [sp.Add(*(wj * vj[c] for wj, vj in zip(w, vals))) for c in range(len(vals[0]))]
        if m is None:
            m, lsum, acc = m_blk, l_blk, acc_blk
            continue
        new = sv.extremum(sp.Max, [m, m_blk])
        old_scale, blk_scale = sp.exp(m - new), sp.exp(m_blk - new)
        lsum = lsum * old_scale + l_blk * blk_scale
        acc = [a * old_scale + b * blk_scale for a, b in zip(acc, acc_blk)]
        m = new
    return [a / lsum for a in acc]


def _symbolic(sv, args, attrs, rtype):
    sp = sv.sp
    q, k, v, bias = (sv.as_array(a) for a in args)
    scale = sp.Rational(float(attrs["scale"]))  # exact, as the Const it came from
    m, n = q.shape[-2], k.shape[-2]
    bias = np.broadcast_to(bias, q.shape[:-1] + (n,))
    causal = attrs.get("causal", 0)
    hidden = attention_op.causal_mask(m, n) if causal else np.zeros((m, n), bool)
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
            out[idx + (i,)] = online_softmax_row(sv, scores, [tuple(vb[j]) for j in seen])
    return out


def _symbolic_backward(sv, args, attrs, rtype):
    """FlashAttention-2's backward as the kernel computes it: the probabilities from the row
    log-sum-exp, D = rowsum(g * o) from the given output o; `wrt` picks dq, dk or dv. So
    rules/attention_adjoint.egg's fused adjoints are proved against the vector-Jacobian product
    of the naive program."""
    sp = sv.sp
    q, k, v, bias, o, g = (sv.as_array(a) for a in args)
    scale = sp.Rational(float(attrs["scale"]))
    m, n, wrt = q.shape[-2], k.shape[-2], attrs["wrt"]
    bias = np.broadcast_to(bias, q.shape[:-1] + (n,))
    causal = attrs.get("causal", 0)
    hidden = attention_op.causal_mask(m, n) if causal else np.zeros((m, n), bool)
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


def _batch(bt, op, args, batched, attrs):
    q, k, v = (a if b else bt.full(a) for a, b in zip(args[:3], batched[:3]))
    bias = args[3]
    if batched[3]:
        bias = bt.align(bias, q.type.rank - 1)
    return bt.emit(op, [q, k, v, bias], **attrs)


def _batch_backward(bt, op, args, batched, attrs):
    ops = [a if b or i == 3 else bt.full(a) for i, (a, b) in enumerate(zip(args, batched))]
    if batched[3]:
        ops[3] = bt.align(args[3], ops[0].type.rank - 1)
    return bt.emit(op, ops, **attrs)


def backward_spec() -> OpSpec:
    """attentionBackward q, k, v, bias, o, g: one of the fused backward's three results (wrt);
    codegen runs the three of one attention in one kernel (codegen/planning/attention.py)."""
    return OpSpec(
        "attentionBackward",
        ATTENTION,
        6,
        "AttentionBackward",
        attention_op.attention_backward_type,
        attention_op.attention_backward,
        attrs=("scale", "causal", "wrt"),
        egg_attrs=(("scale", "f64"), ("causal", "i64"), ("wrt", "i64")),
        float_only=True,
        differentiable=False,  # no adjoint rules: ad/ differentiates egraph/attention_plain.py's form
        batch=_batch_backward,
        symbolic=_symbolic_backward,
    )


def spec() -> OpSpec:
    return OpSpec(
        "attention",
        ATTENTION,
        4,
        "Attention",
        attention_op.attention_type,
        attention_op.attention,
        attrs=("scale", "causal"),
        egg_attrs=(("scale", "f64"), ("causal", "i64")),
        float_only=True,
        nondiff_operands=(3,),  # the bias is a mask (rules/attention_adjoint.egg)
        batch=_batch,
        symbolic=_symbolic,
    )
