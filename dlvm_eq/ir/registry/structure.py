"""Values that are not computed elementwise: literals, tuples of results, and calls.

    %c = literal 0.5: <3 x f32>
    return (%a: <3 x f32>, %b: f32)           // a tuple literal, only as a function result
    %y = apply @g(%x: <3 x f32>): <3 x f32>   // inlined before the e-graph sees it

vmap handles tuples and calls itself (ir/batching.py); a literal has no operand to batch.
"""

from __future__ import annotations

import numpy as np

from ...errors import IRError
from ..op_spec import CALL, LITERAL, TUPLE, OpSpec, fail, tensors
from ..types import TupleType


def _extract_type(types, attrs):
    (t,) = types
    i = attrs["index"]
    if not isinstance(t, TupleType):
        fail("extract", f"expected a tuple operand, got {t}")
    if not 0 <= i < len(t.elements):
        fail("extract", f"index {i} out of range for {t}")
    return t.elements[i]


def _literal_type(types, attrs):
    t = attrs["type"]
    value = np.asarray(attrs["value"])
    if value.ndim and value.shape != t.shape:
        fail("literal", f"array literal of shape {value.shape} does not match {t}")
    return t


def _tuple_type(types, attrs):
    return TupleType(tuple(tensors("literal", types)))


def _literal(args, attrs):
    t = attrs["type"]
    return np.broadcast_to(np.asarray(attrs["value"], dtype=t.dtype.numpy), t.shape).copy()


def _unevaluable(args, attrs):
    raise IRError("apply must be inlined or evaluated by the interpreter")


def literal_specs() -> list[OpSpec]:
    return [
        OpSpec(
            "literal",
            LITERAL,
            0,
            "Const",
            _literal_type,
            _literal,
            attrs=("value", "type"),
            differentiable=False,
        ),
        # A tuple of values, spelled `literal (%a: T, %b: T)` in DLVM; only as a function result.
        OpSpec("tuple", TUPLE, None, "Tuple", _tuple_type, lambda args, at: tuple(args)),
        OpSpec(
            "extract",
            TUPLE,
            1,
            "Extract",
            _extract_type,
            lambda args, at: args[0][at["index"]],
            attrs=("index",),
        ),
    ]


def apply_spec() -> OpSpec:
    return OpSpec(
        "apply",
        CALL,
        None,
        "Apply",
        lambda types, attrs: attrs["type"],
        _unevaluable,
        attrs=("callee", "type"),
    )
