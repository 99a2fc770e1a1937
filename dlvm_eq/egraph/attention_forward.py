"""Attention before differentiation (issue 33): the reverse pass differentiates the program as
written, one primitive at a time, so the adjoint of a naive softmax(q kᵀ s + b) v is the plain
backward, whose seq x seq probabilities are stored. Here the forward is first optimized with
rules/attention.egg; where extraction picks the fused `attention` op (the cost model's choice
for the forward), the reverse pass then meets `attention` itself, and
rules/attention_adjoint.egg offers the fused backward beside the plain one (extraction prices
both again, with the backward). The fused forward is kept only where the fused forward and
backward together are predicted no dearer than the naive program and its reverse pass, on
`target`'s machine (a gradient traced under `jit(target="gpu")` is priced for the gpu's PTX
kernels: extract/attention_cost.py).

    fn = with_fused_attention(module, fn, target, budget)   # fn itself where nothing is fused
"""

from __future__ import annotations

from ..errors import DlvmError
from ..ir.module import Const, Function, Module
from ..ir.types import TensorType

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
    if plain_pays_as_written(fn, target):  # no e-graph needed to say it (issue 32)
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
    if _bias_is_differentiated(got, wrt) or not _fused_pass_pays(got, target):
        return fn
    return got


def _scaled_product(made: dict, x):
    """(q, kᵀ) where x is q @ kᵀ or (q @ kᵀ) times a constant (either side), else None."""
    src = made.get(id(x))
    if src is not None and src.op == "multiply":
        a, b = src.operands
        src = (
            made.get(id(a))
            if isinstance(b, Const)
            else made.get(id(b))
            if isinstance(a, Const)
            else None
        )
    if src is None or src.op not in PRODUCTS or len(src.operands) != 2:
        return None
    return tuple(src.operands)


def plain_pays_as_written(fn: Function, target: str) -> bool:
    """Whether every softmax(q kᵀ c) v of fn, read off the IR as written (no bias, no mask),
    is predicted cheaper as the plain program with its reverse pass than fused: what
    `_fused_pass_pays` would decide about the `attention` op that rules/attention.egg makes of
    it (q, kᵀ transposed back, v, a scalar zero bias), so the forward's e-graph (a whole
    saturation and extraction, wasted on the transformer step) is not built to find it out.
    False where any such product is not of that form (a bias, a mask, another shape)."""
    from .attention_plain import priced_as_written

    made = {id(inst.result): inst for inst in fn.body}
    sites = 0
    for inst in fn.body:
        if inst.op not in PRODUCTS or len(inst.operands) != 2:
            continue
        p, v = inst.operands
        div = made.get(id(p))
        if div is None or div.op != "divide":
            continue
        ex = made.get(id(div.operands[0]))
        if ex is None or ex.op != "exp":
            continue
        sub = made.get(id(ex.operands[0]))
        qk = (
            _scaled_product(made, sub.operands[0])
            if sub is not None and sub.op == "subtract"
            else None
        )
        if qk is None:
            return False
        q, kt = qk
        if q.type.rank < 3 or kt.type.rank != q.type.rank or v.type.rank != q.type.rank:
            return False
        s = kt.type.shape
        k = TensorType(s[:-2] + (s[-1], s[-2]), kt.type.dtype)
        bias = TensorType((), q.type.dtype)
        attrs = {"scale": 1.0, "causal": 0}
        try:
            fused = priced_as_written([q.type, k, v.type, bias], attrs, True, True, target)
            plain = priced_as_written([q.type, k, v.type, bias], attrs, False, True, target)
        except DlvmError:
            return False
        if not plain < fused:
            return False
        sites += 1
    return sites > 0


def _fused_pass_pays(fn: Function, target: str) -> bool:
    """Whether, for every `attention` of fn, the fused forward and backward together are
    predicted no dearer than the naive forward and its reverse pass: the forward's extraction
    priced the forward alone, but here it decides the backward too (the plain backward reads
    the forward's stored probabilities, so at seq 256 a cheaper fused forward still made a
    dearer step: measured 3.95 against 3.49 ms, benchmarks/attention.py --pricing)."""
    from .attention_plain import priced_as_written

    for inst in fn.body:
        if inst.op != "attention":
            continue
        types = [o.type for o in inst.operands]
        attrs = {"scale": inst.attrs["scale"], "causal": inst.attrs.get("causal", 0)}
        try:
            fused = priced_as_written(types, attrs, True, True, target)
            plain = priced_as_written(types, attrs, False, True, target)
        except DlvmError:  # a form the naive formula does not cover: the extraction's choice
            continue
        if plain < fused:
            return False
    return True
