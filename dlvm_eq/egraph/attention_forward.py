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

from ..ir.module import Function, Module

# a softmax attention needs these ops; other programs skip the extra optimization
NEEDS = ({"exp"}, {"batchMatmul", "dot"})


def with_fused_attention(module: Module | None, fn: Function, target: str, budget) -> Function:
    ops = {inst.op for inst in fn.body}
    if "attention" in ops or any(not (need & ops) for need in NEEDS) or "apply" in ops:
        return fn
    from .optimize import optimize  # late: optimize loads egglog

    one = Module(module.name if module is not None else "m", "raw")
    one.add(fn)
    got = optimize(one, fn.name, target=target, budget=budget).module[fn.name]
    return got if any(inst.op == "attention" for inst in got.body) else fn
