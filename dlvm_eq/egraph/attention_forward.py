"""Attention before differentiation (issue 33): the reverse pass differentiates the program as
written, one primitive at a time, so the adjoint of a naive softmax(q kᵀ s + b) v is the plain
backward, whose seq x seq probabilities are stored. Here the forward is first optimized with
rules/attention.egg; where extraction picks the fused `attention` op (the cost model's choice
for the forward), the reverse pass then meets `attention` itself, and
rules/attention_adjoint.egg offers the fused backward beside the plain one (extraction prices
both again, with the backward).

    fn = with_fused_attention(module, fn, target, budget)   # fn itself where nothing is fused
"""

from __future__ import annotations

from ..errors import DlvmError
from ..ir.module import Function, Module

PRODUCTS = ("batchMatmul", "dot")


def softmax_times_matrix(fn: Function) -> bool:
    """Whether fn has a product whose operand is a quotient of an exp (a softmax times v, as
    the DSL writes softmax): only such programs pay for the extra optimization."""
    made = {id(inst.result): inst for inst in fn.body}
    for inst in fn.body:
        if inst.op not in PRODUCTS:
            continue
        for o in inst.operands:
            src = made.get(id(o))
            if src is not None and src.op == "divide":
                num = made.get(id(src.operands[0]))
                if num is not None and num.op == "exp":
                    return True
    return False


def _bias_is_differentiated(fn: Function, wrt) -> bool:
    """Whether an `attention`'s bias depends on a differentiated parameter: the op gives its
    bias no adjoint (a mask), so such a program must be differentiated as written."""
    live = {id(fn.params[i]) for i in wrt}
    for inst in fn.body:
        if inst.op == "attention" and id(inst.operands[3]) in live:
            return True
        if any(id(o) in live for o in inst.operands):
            live.add(id(inst.result))
    return False


def with_fused_attention(
    module: Module | None, fn: Function, target: str, budget, wrt=None
) -> Function:
    """wrt: the indexes of the parameters differentiated (None: all)."""
    ops = {inst.op for inst in fn.body}
    if "attention" in ops or "apply" in ops or not softmax_times_matrix(fn):
        return fn
    from .optimize import optimize  # late: optimize loads egglog

    one = Module(module.name if module is not None else "m", "raw")
    one.add(fn)
    try:
        got = optimize(one, fn.name, target=target, budget=budget).module[fn.name]
    except DlvmError:  # out of time or budget: differentiate the program as written
        return fn
    if not any(inst.op == "attention" for inst in got.body):
        return fn
    wrt = range(len(got.params)) if wrt is None else wrt
    return fn if _bias_is_differentiated(got, wrt) else got
