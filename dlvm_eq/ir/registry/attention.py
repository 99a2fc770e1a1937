"""`attention` (issue 33): softmax(q kᵀ scale + bias) v as one op, which rules/attention.egg
derives from the naive program and codegen runs without writing the scores; its type rule and
interpreter are ir/attention_op.py's, its adjoints rules/attention_adjoint.egg's.

Under vmap the batch is one more batch axis of q, k and v (unbatched ones broadcast to it); a
batched bias gets size-1 axes after the batch axis so that it still broadcasts to the scores.
"""

from __future__ import annotations

from .. import attention_op
from ..op_spec import OpSpec

ATTENTION = "attention"  # a plan step of its own (codegen/planning/attention.py)


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
        float_only=True,
        differentiable=False,  # no adjoint rules: grad of grad keeps the plain program
        batch=_batch_backward,
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
        float_only=True,
        nondiff_operands=(3,),  # the bias is a mask (rules/attention_adjoint.egg)
        batch=_batch,
    )
