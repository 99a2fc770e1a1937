"""Second order through a fused attention (issue 33): `attentionBackward` has no adjoint rules,
so a function holding one (a gradient, differentiated again: `dq.grad` of a function that calls
`dq.grad`) is differentiated as the plain program instead. Here every `attention` and
`attentionBackward` of the function is written back as the naive formula, in the primitives
the DSL traces (a product, the scale, the bias, softmax with its floored row maximum), whose
adjoint rules the reverse pass has:

    x = q kᵀ scale + bias (causal: -inf above the diagonal)     P = softmax(x)     o = P v
    dV = Pᵀ g     dS = P (g vᵀ - rowsum(g o))     dQ = dS k scale     dK = dSᵀ q scale

    fn = with_plain_attention(fn, module)   # fn itself where it holds no attentionBackward
"""

from __future__ import annotations

import numpy as np

from ..ir.attention_op import causal_mask
from ..ir.inline import flatten
from ..ir.module import Const, Function, FunctionBuilder, Module, Value
from ..ir.types import TensorType


def _product(b: FunctionBuilder, x, y):
    return b.emit("batchMatmul" if x.type.rank >= 3 else "dot", [x, y])


def _swap(b: FunctionBuilder, x):
    r = x.type.rank
    return b.emit("transpose", [x], perm=tuple(range(r - 2)) + (r - 1, r - 2))


def _rows(b: FunctionBuilder, x, combinator: str, init: float):
    """x reduced along its last axis, kept as a size-1 axis."""
    r = x.type.rank
    red = b.emit("reduce", [x], combinator=combinator, init=init, axes=(r - 1,))
    return b.emit("shapeCast", [red], shape=x.type.shape[:-1] + (1,))


def _probabilities(b: FunctionBuilder, q, k, bias, attrs):
    dt = q.type.dtype
    x = b.emit("multiply", [_product(b, q, _swap(b, k)), Const.of(float(attrs["scale"]), dt)])
    x = b.emit("add", [x, bias])
    if attrs.get("causal", 0):
        m, n = q.type.shape[-2], k.type.shape[-2]
        hidden = np.where(causal_mask(m, n), -np.inf, 0.0).astype(dt.numpy)
        mask = b.emit("literal", [], value=hidden, type=TensorType((m, n), dt))
        x = b.emit("add", [x, mask])
    e = b.emit("exp", [b.emit("subtract", [x, b.emit("floor", [_rows(b, x, "max", -np.inf)])])])
    return b.emit("divide", [e, _rows(b, e, "add", 0.0)])


def plain_attention(b: FunctionBuilder, ops, attrs):
    """softmax(q kᵀ scale + bias) v in primitives, emitted into b."""
    q, k, v, bias = ops
    return _product(b, _probabilities(b, q, k, bias, attrs), v)


def plain_attention_backward(b: FunctionBuilder, ops, attrs):
    """attentionBackward's result (attrs["wrt"]) in primitives, emitted into b."""
    q, k, v, bias, o, g = ops
    p = _probabilities(b, q, k, bias, attrs)
    if attrs["wrt"] == 2:
        return _product(b, _swap(b, p), g)
    d = _rows(b, b.emit("multiply", [g, o]), "add", 0.0)
    ds = b.emit("multiply", [p, b.emit("subtract", [_product(b, g, _swap(b, v)), d])])
    grad = _product(b, ds, k) if attrs["wrt"] == 0 else _product(b, _swap(b, ds), q)
    return b.emit("multiply", [grad, Const.of(float(attrs["scale"]), q.type.dtype)])


PLAIN = {"attention": plain_attention, "attentionBackward": plain_attention_backward}


def with_plain_attention(fn: Function, module: Module | None) -> Function:
    """fn with its fused attentions written as the naive formula, where it holds an
    attentionBackward (fn itself otherwise): the program a second derivative differentiates."""
    if not any(inst.op == "attentionBackward" for inst in fn.body):
        return fn
    flat = flatten(fn, module)
    b = FunctionBuilder(fn.name, [p.type for p in flat.params], [p.name for p in flat.params])
    env: dict[int, object] = {id(p): q for p, q in zip(flat.params, b.params)}

    def get(o):
        return env[id(o)] if isinstance(o, Value) else o

    for inst in flat.body:
        ops = [get(o) for o in inst.operands]
        expand = PLAIN.get(inst.op)
        if expand is not None:
            env[id(inst.result)] = expand(b, ops, inst.attrs)
        else:
            env[id(inst.result)] = b.emit(
                inst.op, ops, inst.result.name, inst.location, **inst.attrs
            )
    results = [get(r) for r in flat.results]
    out = b.finish(results if flat.tuple_result else results[0])
    out.location = fn.location
    return out


def priced_as_written(types, attrs, fused: bool, backward: bool, target="cpu") -> float:
    """The cost model's seconds (egraph/optimize.program_cost) of one attention of operand
    types (q, k, v, bias) as a program: the fused `attention` op, or the naive formula; with
    backward, the forward and dQ, dK and dV together (the naive backward reads the forward's
    probabilities, so it is the alternative to both fused kernels, not to the backward's alone)."""
    from .optimize import program_cost  # late: optimize imports this module

    q, k, v, bias = types
    out = TensorType(q.shape[:-1] + (v.shape[-1],), q.dtype)
    b = FunctionBuilder("priced", [q, k, v, bias, out], ["q", "k", "v", "bias", "g"])
    ops = b.params[:4]
    if fused:
        o = b.emit("attention", ops, **attrs)
        grads = [
            b.emit("attentionBackward", [*ops, o, b.params[4]], **attrs, wrt=w) for w in range(3)
        ]
    else:
        o = plain_attention(b, ops, attrs)
        grads = [
            plain_attention_backward(b, [*ops, o, b.params[4]], {**attrs, "wrt": w})
            for w in range(3)
        ]
    return program_cost(b.finish([o, *grads] if backward else o), target=target)
