"""Scalar expression DAG -> llvmlite instructions, for one element. Target independent: the
CPU and NVPTX back ends supply how input i is loaded at the current element.

    >>> v = lower(Emitter(builder), spec.outputs, spec.input_dtypes, load=lambda i: ...)
"""

from __future__ import annotations

import math
from collections.abc import Callable

from llvmlite import ir

from ...ir.ops import OPS
from ..kernels.spec import (
    Binary,
    Cast,
    Const,
    Expr,
    KernelError,
    Load,
    Select,
    Unary,
    dtype_of,
    walk,
)
from . import polymath
from .emitter import I1, I8, I32, REDUCE_FLAGS, STORAGE_TYPES, VALUE_TYPES, Emitter

INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def _sign(e: Emitter, x, dt):
    if dt == "i32":
        b = e.b
        pos = b.zext(b.icmp_signed(">", x, ir.Constant(I32, 0)), I32)
        neg = b.zext(b.icmp_signed("<", x, ir.Constant(I32, 0)), I32)
        return b.sub(pos, neg)
    one = e.const_like(x, 1.0)
    r = e.select(e.fcmp("<", x, e.const_like(x, 0.0)), e.fneg(one), x)  # keeps 0, -0 and NaN
    return e.select(e.fcmp(">", x, e.const_like(x, 0.0)), one, r)


def _relu(e: Emitter, x, dt):
    if dt == "i32":
        return e.intrinsic("smax", x, ir.Constant(I32, 0))
    return e.select(e.fcmp("<", x, e.const_like(x, 0.0)), e.const_like(x, 0.0), x)  # NaN stays


class ScalarVocabulary:
    """What a registry op's kernel formula (`OpSpec.scalar`, ir/registry/) is written with: the
    instructions and polynomial math routines of one element of dtype `dt`.

        REGISTRY["rsqrt"].scalar(ScalarVocabulary(e, "f32"), x)   # 1 / sqrt(x)
    """

    def __init__(self, e: Emitter, dt: str):
        self.e, self.dt = e, dt

    def const(self, like, value: float):
        return self.e.const_like(like, value)

    def neg(self, x):
        return self.e.b.neg(x) if self.dt == "i32" else self.e.fneg(x)

    def abs(self, x):
        if self.dt == "i32":
            return self.e.intrinsic("abs", x, ir.Constant(I1, 0), ret=I32)
        return self.e.intrinsic("fabs", x)

    def mul(self, a, b):
        return self.e.b.mul(a, b) if self.dt == "i32" else self.e.fmul(a, b)

    def div(self, a, b):
        return self.e.fdiv(a, b)

    def sqrt(self, x):
        return self.e.intrinsic("sqrt", x)

    def floor(self, x):
        return self.e.intrinsic("floor", x)

    def ceil(self, x):
        return self.e.intrinsic("ceil", x)

    def rint(self, x):
        return self.e.intrinsic("rint", x)

    def sign(self, x):
        return _sign(self.e, x, self.dt)

    def relu(self, x):
        return _relu(self.e, x, self.dt)

    def not_(self, x):
        return self.e.b.not_(x)

    def math(self, name: str, x):
        if self.dt not in ("f32", "f64"):
            raise KernelError(f"{name} is lowered for floats only, not {self.dt}")
        return polymath.MATH[name](self.e, x)


def _formula(spec):
    return lambda e, x, dt: spec.scalar(ScalarVocabulary(e, dt), x)


# kernel name -> (emitter, x, dtype) -> value: every unary op's formula from the registry
UNARY_LOWER: dict[str, Callable] = {
    s.kernel: _formula(s) for s in OPS.values() if s.arity == 1 and s.scalar is not None
}


def _int_div(e: Emitter, a, b):
    """C-style truncating division (the IR's semantics); x/0 = 0 and INT_MIN/-1 = INT_MIN
    instead of LLVM's undefined behaviour."""
    bb = e.b
    zero = bb.icmp_signed("==", b, ir.Constant(I32, 0))
    ovf = bb.and_(
        bb.icmp_signed("==", a, ir.Constant(I32, INT_MIN)),
        bb.icmp_signed("==", b, ir.Constant(I32, -1)),
    )
    safe = bb.select(bb.or_(zero, ovf), ir.Constant(I32, 1), b)
    q = bb.sdiv(a, safe)
    q = bb.select(ovf, ir.Constant(I32, INT_MIN), q)
    return bb.select(zero, ir.Constant(I32, 0), q)


_FCMP = {"eq": "==", "ne": "u!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_ICMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_INT_BIN = {"add": "add", "sub": "sub", "mul": "mul"}
# bit operations on the word as unsigned; shift counts mod 32 (a count >= 32 is poison in LLVM)
_BITS = {"xor": "xor", "shiftLeft": "shl", "shiftRightLogical": "lshr"}
_FLOAT_BIN = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}
# The binary ops lower_binary emits, per operand dtype; llvm/vocabulary.py checks them and
# UNARY_LOWER against the op table (ir/ops.py), so an op is never added to one alone.
BINARY_LOWERED = {
    "float": frozenset(_FLOAT_BIN) | {"min", "max", "pow"} | frozenset(_FCMP),
    "i32": frozenset(_INT_BIN) | {"div", "min", "max"} | frozenset(_ICMP) | frozenset(_BITS),
    "bool": frozenset(_ICMP) | {"and", "or"},
}


def lower_binary(e: Emitter, op: str, a, b, dt: str):
    if op in _FCMP or op in ("and", "or"):
        if op == "and":
            return e.b.and_(a, b)
        if op == "or":
            return e.b.or_(a, b)
        if dt in ("i32", "bool"):
            return e.b.icmp_signed(_ICMP[op], a, b)
        return e.fcmp(_FCMP[op], a, b)
    if dt == "i32":
        if op == "div":
            return _int_div(e, a, b)
        if op in ("min", "max"):
            return e.intrinsic("s" + op, a, b)
        if op in _BITS:
            if op != "xor":
                b = e.b.and_(b, ir.Constant(I32, 31))
            return getattr(e.b, _BITS[op])(a, b)
        return getattr(e.b, _INT_BIN[op])(a, b)
    if op in ("min", "max"):  # NaN-propagating, as numpy.minimum/maximum
        return e.intrinsic("minimum" if op == "min" else "maximum", a, b)
    if op == "pow":
        return polymath.pow(e, a, b)
    return getattr(e, _FLOAT_BIN[op])(a, b)


def lower_cast(e: Emitter, x, src: str, dst: str):
    """numpy's astype, except float -> i32 saturates and maps NaN to 0 (numpy: undefined)."""
    b = e.b
    if src == dst:
        return x
    if dst == "bool":
        if src == "i32":
            return b.icmp_signed("!=", x, ir.Constant(I32, 0))
        return e.fcmp("u!=", x, e.const_like(x, 0.0))  # NaN is true, as in numpy
    t = VALUE_TYPES[dst]
    if src == "bool":
        return b.zext(x, t) if dst == "i32" else b.uitofp(x, t)
    if src == "i32":
        return b.sitofp(x, t)
    if dst == "i32":
        return e.fptosi_sat(x, I32)
    return b.fpext(x, t) if dst == "f64" else b.fptrunc(x, t)


def constant(value, dt: str) -> ir.Constant:
    if dt == "bool":
        return ir.Constant(I1, int(bool(value)))
    if dt == "i32":
        return ir.Constant(I32, int(value))
    return ir.Constant(VALUE_TYPES[dt], float(value))


def lower(e: Emitter, roots, input_dtypes, load: Callable[[int], ir.Value]) -> list[ir.Value]:
    """Values of the resolved expressions `roots`; each shared node is emitted once."""
    vals: dict[Expr, ir.Value] = {}
    for node in walk(roots):
        dt = dtype_of(node, input_dtypes)
        if isinstance(node, Load):
            v = load(node.index)
        elif isinstance(node, Const):
            v = constant(node.value, dt)
        elif isinstance(node, Unary):
            v = UNARY_LOWER[node.op](e, vals[node.x], dt)
        elif isinstance(node, Binary):
            v = lower_binary(e, node.op, vals[node.a], vals[node.b], dtype_of(node.a, input_dtypes))
        elif isinstance(node, Select):
            v = e.select(vals[node.cond], vals[node.a], vals[node.b])
        elif isinstance(node, Cast):
            v = lower_cast(e, vals[node.x], dtype_of(node.x, input_dtypes), node.dtype)
        else:
            raise KernelError(f"cannot lower {node!r}")
        vals[node] = v
    return [vals[r] for r in roots]


# ---- memory representation: bools are bytes
def from_storage(e: Emitter, v, dt: str):
    return e.b.icmp_unsigned("!=", v, ir.Constant(I8, 0)) if dt == "bool" else v


def to_storage(e: Emitter, v, dt: str):
    return e.b.zext(v, I8) if dt == "bool" else v


def storage_type(dt: str) -> ir.Type:
    return STORAGE_TYPES[dt]


def combine(e: Emitter, op: str, acc, v, dt: str):
    """One reduction step acc (op) v. Floats: reassociable (vectorizable) add/mul; max/min
    propagate NaN like numpy."""
    if dt == "i32":
        return (
            {"add": e.b.add, "mul": e.b.mul}[op](acc, v)
            if op in ("add", "mul")
            else e.intrinsic("s" + op, acc, v)
        )
    if op == "add":
        return e.fadd(acc, v, flags=REDUCE_FLAGS)
    if op == "mul":
        return e.fmul(acc, v, flags=REDUCE_FLAGS)
    return e.intrinsic("maximum" if op == "max" else "minimum", acc, v)


def init_constant(value, dt: str) -> ir.Constant:
    if dt == "i32":
        return ir.Constant(I32, int(value))
    return ir.Constant(VALUE_TYPES[dt], float(value) if not math.isnan(value) else math.nan)
