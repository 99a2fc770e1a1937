"""Scalar expression DAG -> llvmlite instructions, for one element. Target independent: the
CPU and NVPTX back ends supply how input i is loaded at the current element.

    >>> v = lower(Emitter(builder), spec.outputs, spec.input_dtypes, load=lambda i: ...)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from llvmlite import ir

from ...ir.ops import BINARY, COMPARE, LOGIC, OPS
from ...ir.registry.reduction import COMBINATORS
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
BINARY_KINDS = (BINARY, COMPARE, LOGIC)  # bit operations are BINARY


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

    def _numbers(self, name: str) -> bool:
        """Whether the element is an i32 (else a float); bools have no arithmetic."""
        if self.dt == "bool":
            raise KernelError(f"{name} is lowered for numbers only, not bool")
        return self.dt == "i32"

    def _only(self, name: str, dt: str):
        if self.dt != dt:
            raise KernelError(f"{name} is lowered for {dt} only, not {self.dt}")

    def add(self, a, b, reassociate: bool = False):
        """reassociate: a reduction's step, which may be reordered (vectorized)."""
        if self._numbers("add"):
            return self.e.b.add(a, b)
        return self.e.fadd(a, b, flags=REDUCE_FLAGS) if reassociate else self.e.fadd(a, b)

    def sub(self, a, b):
        return self.e.b.sub(a, b) if self._numbers("sub") else self.e.fsub(a, b)

    def mul(self, a, b, reassociate: bool = False):
        if self._numbers("mul"):
            return self.e.b.mul(a, b)
        return self.e.fmul(a, b, flags=REDUCE_FLAGS) if reassociate else self.e.fmul(a, b)

    def div(self, a, b):
        return _int_div(self.e, a, b) if self._numbers("div") else self.e.fdiv(a, b)

    def min(self, a, b):  # floats: NaN-propagating, as numpy.minimum
        return self.e.intrinsic("smin" if self._numbers("min") else "minimum", a, b)

    def max(self, a, b):
        return self.e.intrinsic("smax" if self._numbers("max") else "maximum", a, b)

    def pow(self, a, b):
        if self.dt not in FLOAT_DTYPES:
            raise KernelError(f"pow is lowered for floats only, not {self.dt}")
        return polymath.pow(self.e, a, b)

    def compare(self, op: str, a, b):
        """op one of eq ne lt le gt ge; floats: ordered, except ne (true on NaN, as numpy)."""
        if self.dt in ("i32", "bool"):
            return self.e.b.icmp_signed(_ICMP[op], a, b)
        return self.e.fcmp(_FCMP[op], a, b)

    def and_(self, a, b):
        self._only("and", "bool")
        return self.e.b.and_(a, b)

    def or_(self, a, b):
        self._only("or", "bool")
        return self.e.b.or_(a, b)

    def xor(self, a, b):
        self._only("xor", "i32")
        return self.e.b.xor(a, b)

    def shl(self, a, count):  # counts mod 32: a count >= 32 is poison in LLVM
        self._only("shiftLeft", "i32")
        return self.e.b.shl(a, self.e.b.and_(count, ir.Constant(I32, 31)))

    def lshr(self, a, count):
        self._only("shiftRightLogical", "i32")
        return self.e.b.lshr(a, self.e.b.and_(count, ir.Constant(I32, 31)))

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
        if self.e.outline:
            return self.e.outlined(name, x, polymath.MATH[name])
        return polymath.MATH[name](self.e, x)


def _formula(spec):
    return lambda e, x, dt: spec.scalar(ScalarVocabulary(e, dt), x)


def _binary_formula(spec):
    return lambda e, a, b, dt: spec.scalar(ScalarVocabulary(e, dt), a, b)


# kernel name -> (emitter, x, dtype) -> value: every unary op's formula from the registry
UNARY_LOWER: dict[str, Callable] = {
    s.kernel: _formula(s) for s in OPS.values() if s.arity == 1 and s.scalar is not None
}
# kernel name -> (emitter, a, b, operand dtype) -> value: every binary op's, the same way
BINARY_LOWER: dict[str, Callable] = {
    s.kernel: _binary_formula(s)
    for s in OPS.values()
    if s.arity == 2 and s.kind in BINARY_KINDS and s.scalar is not None
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
FLOAT_DTYPES = ("f32", "f64")


def _lowers(formula, dt: str) -> bool:
    """Whether a binary formula lowers for operands of dtype dt, tried in a scratch function."""
    t = VALUE_TYPES[dt]
    fn = ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), [t, t]), "probe")
    e = Emitter(ir.IRBuilder(fn.append_basic_block()))
    try:
        formula(e, *fn.args, dt)
    except KernelError:
        return False
    return True


@functools.cache
def binary_lowered() -> dict[str, frozenset]:
    """The binary kernel ops whose registry formula lowers, per operand dtype ("float": both
    float widths), found by lowering each one; llvm/vocabulary.py checks them against the
    dtypes the kernels accept (kernels/spec.py)."""
    by_dtype = {dt: {op for op, f in BINARY_LOWER.items() if _lowers(f, dt)} for dt in VALUE_TYPES}
    return {
        "float": frozenset(by_dtype["f32"] & by_dtype["f64"]),
        "i32": frozenset(by_dtype["i32"]),
        "bool": frozenset(by_dtype["bool"]),
    }


def lower_binary(e: Emitter, op: str, a, b, dt: str):
    if op not in BINARY_LOWER:
        raise KernelError(f"binary op {op!r} has no kernel formula in the registry")
    return BINARY_LOWER[op](e, a, b, dt)


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


# a reduction kernel's op (its combinator's kernel name) -> the registry's combinator
COMBINATOR_OF_KERNEL = {c.kernel: c for c in COMBINATORS.values()}


def combine(e: Emitter, op: str, acc, v, dt: str):
    """One reduction step acc (op) v: the registry's combinator step (ir/registry/reduction.py).
    Floats: reassociable (vectorizable) add/mul; max/min propagate NaN like numpy."""
    return COMBINATOR_OF_KERNEL[op].scalar(ScalarVocabulary(e, dt), acc, v)


def init_constant(value, dt: str) -> ir.Constant:
    if dt == "i32":
        return ir.Constant(I32, int(value))
    return ir.Constant(VALUE_TYPES[dt], float(value) if not math.isnan(value) else math.nan)
