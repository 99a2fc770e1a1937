"""Bit operations on i32 words read as unsigned 32-bit (counter-based random numbers,
dsl/random.py): xor, shiftLeft, shiftRightLogical. Shift counts are taken mod 32 (LLVM: a count
of 32 or more is poison). Not differentiable (integer results); no rewrites but fusion.

    >>> REGISTRY["xor"].evaluate([np.int32(6), np.int32(3)], {})
    5
"""

from __future__ import annotations

import numpy as np

from ..op_spec import BINARY, OpSpec, elementwise_type, fail
from ..types import I32
from .batch_rules import elementwise


def _words(a, b):
    """The operands as int32 words, shift counts mod 32."""
    return np.asarray(a).astype(np.int32), np.asarray(b).astype(np.int32) & 31


def _xor(args, attrs):
    return np.bitwise_xor(
        np.asarray(args[0]).astype(np.int32), np.asarray(args[1]).astype(np.int32)
    )


def _shift_left(args, attrs):
    a, s = _words(*args)
    return np.left_shift(a, s)


def _shift_right_logical(args, attrs):
    a, s = _words(*args)
    return np.right_shift(a.view(np.uint32), s.astype(np.uint32)).view(np.int32)


_ROWS = {"xor": _xor, "shiftLeft": _shift_left, "shiftRightLogical": _shift_right_logical}
# the kernel formulas: the vocabulary's instructions, which take shift counts mod 32 as above
_KERNEL = {
    "xor": lambda k, a, b: k.xor(a, b),
    "shiftLeft": lambda k, a, count: k.shl(a, count),
    "shiftRightLogical": lambda k, a, count: k.lshr(a, count),
}
BIT_OPS = tuple(_ROWS)  # i32 only: the kernels accept them on no other dtype
_SYMPY: dict[str, object] = {}


def _type(name: str):
    def rule(types, attrs):
        t = elementwise_type(name, types)
        if t.dtype is not I32:
            fail(name, f"expected i32 operands, got {t.dtype}")
        return t

    return rule


def _sympy(name: str):
    """A sympy function of two words that evaluates once both are numbers (bit operations have
    no symbolic algebra here), with the numpy semantics above."""

    def meaning(sp, a, b):
        fn = _SYMPY.get(name)
        if fn is None:

            def evaluate(cls, x, y):
                if x.is_number and y.is_number:
                    words = [np.asarray(int(v), np.int32) for v in (x, y)]
                    return sp.Integer(int(_ROWS[name](words, {})))
                return None

            fn = _SYMPY[name] = type(
                name, (sp.Function,), {"nargs": 2, "eval": classmethod(evaluate)}
            )
        return fn(a, b)

    return meaning


def specs() -> list[OpSpec]:
    return [
        OpSpec(
            name,
            BINARY,
            2,
            name[0].upper() + name[1:],
            _type(name),
            fn,
            differentiable=False,
            kernel=name,
            scalar=_KERNEL[name],
            sympy=_sympy(name),
            cost="cheap",
            batch=elementwise,
        )
        for name, fn in _ROWS.items()
    ]
