"""Elementwise ops: unary math, binary arithmetic, comparisons, logic, select and casts.

One row per op says everything about it (see OpSpec): numpy and sympy semantics, the DSL
names, the fused-kernel formula, the cost class. Binary ops broadcast (numpy's rules).

    >>> REGISTRY["exp"].sympy(sympy, sympy.Symbol("x"))
    exp(x)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..op_spec import (
    BINARY,
    CAST,
    COMPARE,
    LOGIC,
    SELECT,
    UNARY,
    OpSpec,
    elementwise_type,
    fail,
    pascal,
    quiet,
    tensors,
)
from ..types import BOOL, broadcast_shapes
from .batch_rules import elementwise

TRANSCENDENTAL = "transcendental"


def _rsqrt(x):
    return 1.0 / np.sqrt(x)


def _relu(x):
    return np.maximum(x, np.zeros((), x.dtype))


def _softplus(x):
    return np.logaddexp(np.zeros((), x.dtype), x)


def _sigmoid(x):
    from scipy.special import expit  # imported on first use: scipy costs ~0.2 s to import

    return expit(x)


def _erf(x):
    from scipy.special import erf

    return erf(x)


def _math(name: str):
    """A kernel formula that is one of codegen's polynomial math routines."""
    return lambda k, x: k.math(name, x)


def _max0(sp, x):
    return sp.Max(x, sp.S.Zero)


class _Unary:
    """A unary row: numpy function, sympy meaning, kernel formula, and how it is priced."""

    def __init__(self, fn, sympy, scalar, cost="cheap", int_ok=False, measured=None, dsl=None):
        self.fn, self.sympy, self.scalar, self.cost = fn, sympy, scalar, cost
        self.int_ok, self.measured, self.dsl = int_ok, measured, dsl


_U = _Unary
# measured: the op whose kernel a calibration times for this one (calibration/measure.py);
# sinh and cosh are priced there as two exponentials
# the sympy meaning of round and relu needs verify/symbolic's helpers: it maps them itself
UNARY_ROWS: dict[str, _Unary] = {
    "negate": _U(np.negative, lambda sp, x: -x, lambda k, x: k.neg(x), int_ok=True, dsl="negative"),
    "exp": _U(np.exp, lambda sp, x: sp.exp(x), _math("exp"), TRANSCENDENTAL, measured="exp"),
    "log": _U(np.log, lambda sp, x: sp.log(x), _math("log"), TRANSCENDENTAL, measured="log"),
    "tanh": _U(np.tanh, lambda sp, x: sp.tanh(x), _math("tanh"), TRANSCENDENTAL, measured="tanh"),
    "sinh": _U(np.sinh, lambda sp, x: sp.sinh(x), _math("sinh"), TRANSCENDENTAL),
    "cosh": _U(np.cosh, lambda sp, x: sp.cosh(x), _math("cosh"), TRANSCENDENTAL),
    "sin": _U(np.sin, lambda sp, x: sp.sin(x), _math("sin"), TRANSCENDENTAL, measured="sin"),
    "cos": _U(np.cos, lambda sp, x: sp.cos(x), _math("cos"), TRANSCENDENTAL, measured="sin"),
    "tan": _U(np.tan, lambda sp, x: sp.tan(x), _math("tan"), TRANSCENDENTAL, measured="sin"),
    "sqrt": _U(
        np.sqrt, lambda sp, x: sp.sqrt(x), lambda k, x: k.sqrt(x), "divide", measured="sqrt"
    ),
    "rsqrt": _U(
        _rsqrt,
        lambda sp, x: 1 / sp.sqrt(x),
        lambda k, x: k.div(k.const(x, 1.0), k.sqrt(x)),
        "divide",
        measured="rsqrt",
    ),
    "square": _U(np.square, lambda sp, x: x**2, lambda k, x: k.mul(x, x), int_ok=True),
    "sign": _U(np.sign, lambda sp, x: sp.sign(x), lambda k, x: k.sign(x), int_ok=True),
    "floor": _U(np.floor, lambda sp, x: sp.floor(x), lambda k, x: k.floor(x)),
    "ceil": _U(np.ceil, lambda sp, x: sp.ceiling(x), lambda k, x: k.ceil(x)),
    "round": _U(np.rint, None, lambda k, x: k.rint(x)),  # half to even, as numpy.rint
    "abs": _U(np.abs, lambda sp, x: sp.Abs(x), lambda k, x: k.abs(x), int_ok=True),
    # extensions of DLVM's op set
    "sigmoid": _U(
        _sigmoid,
        lambda sp, x: 1 / (1 + sp.exp(-x)),
        _math("sigmoid"),
        TRANSCENDENTAL,
        measured="sigmoid",
    ),
    "relu": _U(_relu, None, lambda k, x: k.relu(x), int_ok=True),
    "log1p": _U(
        np.log1p, lambda sp, x: sp.log(1 + x), _math("log1p"), TRANSCENDENTAL, measured="log"
    ),
    "expm1": _U(
        np.expm1, lambda sp, x: sp.exp(x) - 1, _math("expm1"), TRANSCENDENTAL, measured="exp"
    ),
    "softplus": _U(
        _softplus,
        lambda sp, x: sp.log(1 + sp.exp(x)),
        _math("softplus"),
        TRANSCENDENTAL,
        measured="softplus",
    ),
    # priced as one flop, as before the registry (gelu's extraction was tuned with it)
    "erf": _U(_erf, lambda sp, x: sp.erf(x), _math("erf"), dsl=""),  # issue 14 part B
}
# piecewise constant: the derivative is zero almost everywhere, so no adjoint flows to the operand
PIECEWISE_CONSTANT = {"sign", "floor", "ceil", "round"}


def _binary_row(
    name, fn, sympy, kernel, dsl, cost="cheap", float_only=False, measured=None, infix=None
):
    return OpSpec(
        name,
        BINARY,
        2,
        pascal(name),
        lambda ts, at: elementwise_type(name, ts, float_only=float_only),
        quiet(_two(fn)),
        float_only=float_only,
        dsl=(dsl,),
        kernel=kernel,
        scalar=_by_kernel(kernel),
        sympy=sympy,
        cost=cost,
        measured_as=measured,
        batch=elementwise,
        infix=infix,
    )


def _by_kernel(method: str):
    """The binary kernel formula that is the vocabulary's method of the op's kernel name."""
    return lambda k, a, b: getattr(k, method)(a, b)


def _int_divide(a, b):
    # C-style truncating division, as LLVM's sdiv does; division by zero gives 0 rather than trapping.
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.trunc(np.true_divide(a, np.where(b == 0, 1, b)))
    return np.where(b == 0, 0, q).astype(np.result_type(a, b))


def _divide(args, attrs):
    a, b = args
    if np.issubdtype(np.result_type(a, b), np.integer):
        return _int_divide(a, b)
    return np.divide(a, b)


def _two(f: Callable):
    return lambda args, attrs: f(*args)


# comparisons: (numpy, sympy class name, kernel name, DSL name)
COMPARE_ROWS: dict[str, tuple[np.ufunc, str, str, str]] = {
    "equal": (np.equal, "Eq", "eq", "equal"),
    "notEqual": (np.not_equal, "Ne", "ne", "not_equal"),
    "lessThan": (np.less, "Lt", "lt", "less"),
    "lessThanOrEqual": (np.less_equal, "Le", "le", "less_equal"),
    "greaterThan": (np.greater, "Gt", "gt", "greater"),
    "greaterThanOrEqual": (np.greater_equal, "Ge", "ge", "greater_equal"),
}


def _select_type(types, attrs):
    a, b, m = tensors("select", types)
    if m.dtype is not BOOL:
        fail("select", f"the mask must be bool, got {m}")
    if a.dtype != b.dtype:
        fail("select", f"operands have different data types: {a}, {b}")
    shape = broadcast_shapes(a.shape, b.shape, m.shape)
    if shape is None:
        fail("select", f"shapes do not broadcast: {a}, {b}, mask {m}")
    return a.with_shape(shape)


def _cast_type(types, attrs):
    (a,) = tensors("dataTypeCast", types)
    return a.with_dtype(attrs["dtype"])


def specs() -> list[OpSpec]:
    out = []
    for name, row in UNARY_ROWS.items():
        float_only = not row.int_ok
        out.append(
            OpSpec(
                name,
                UNARY,
                1,
                pascal(name),
                (lambda n, fo: lambda ts, at: elementwise_type(n, ts, float_only=fo))(
                    name, float_only
                ),
                (lambda f: quiet(lambda args, at: f(args[0])))(row.fn),
                float_only=float_only,
                nondiff_operands=(0,) if name in PIECEWISE_CONSTANT else (),
                dsl=(name if row.dsl is None else row.dsl,) if row.dsl != "" else (),
                kernel="neg" if name == "negate" else name,
                scalar=row.scalar,
                sympy=row.sympy,
                cost=row.cost,
                measured_as=row.measured,
                batch=elementwise,
            )
        )
    out += [
        _binary_row("add", np.add, lambda sp, a, b: a + b, "add", "add", infix=("+", 1)),
        _binary_row(
            "subtract", np.subtract, lambda sp, a, b: a - b, "sub", "subtract", infix=("-", 1)
        ),
        _binary_row(
            "multiply", np.multiply, lambda sp, a, b: a * b, "mul", "multiply", infix=("*", 2)
        ),
        _binary_row(
            "power",
            np.power,
            lambda sp, a, b: a**b,
            "pow",
            "power",
            "power",
            True,
            "power",
            infix=("**", 4),
        ),
        _binary_row("min", np.minimum, None, "min", "minimum"),  # sympy: verify's Min helper
        _binary_row("max", np.maximum, None, "max", "maximum"),
    ]
    out.append(
        OpSpec(
            "divide",
            BINARY,
            2,
            "Divide",
            lambda ts, at: elementwise_type("divide", ts),
            quiet(_divide),
            dsl=("divide",),
            kernel="div",
            scalar=_by_kernel("div"),  # i32: truncating, x / 0 = 0 (the interpreter's _int_divide)
            cost="divide",
            measured_as="divide",
            batch=elementwise,
            infix=("/", 2),
        )  # sympy: integer division truncates, verify/symbolic.py spells it
    )
    for name, (fn, sym, kernel, dsl) in COMPARE_ROWS.items():
        out.append(
            OpSpec(
                name,
                COMPARE,
                2,
                pascal(name),
                (lambda n: lambda ts, at: elementwise_type(n, ts, out_dtype=BOOL))(name),
                _two(fn),
                differentiable=False,
                dsl=(dsl,),
                kernel=kernel,
                scalar=(lambda c: lambda k, a, b: k.compare(c, a, b))(kernel),
                sympy=(lambda s: lambda sp, a, b: getattr(sp, s)(a, b))(sym),
                cost="cheap",
                batch=elementwise,
            )
        )
    for name, fn, sym in (("and", np.logical_and, "And"), ("or", np.logical_or, "Or")):
        out.append(
            OpSpec(
                name,
                LOGIC,
                2,
                pascal(name),
                (lambda n: lambda ts, at: elementwise_type(n, ts, bool_only=True))(name),
                _two(fn),
                differentiable=False,
                dsl=("logical_" + name,),
                kernel=name,
                scalar=_by_kernel(name + "_"),
                sympy=(lambda s: lambda sp, a, b: getattr(sp, s)(a, b))(sym),
                cost="cheap",
                batch=elementwise,
            )
        )
    out.append(
        OpSpec(
            "not",
            LOGIC,
            1,
            "Not",
            lambda ts, at: elementwise_type("not", ts, bool_only=True),
            lambda args, at: np.logical_not(args[0]),
            differentiable=False,
            kernel="not",
            scalar=lambda k, x: k.not_(x),
            sympy=lambda sp, x: sp.Not(x),
            cost="cheap",
            batch=elementwise,
        )
    )
    out.append(
        OpSpec(
            "select",
            SELECT,
            3,
            "Select",
            _select_type,
            lambda args, at: np.where(args[2], args[0], args[1]),
            nondiff_operands=(2,),
            cost="cheap",
            batch=elementwise,
        )
    )
    return out


def cast_spec() -> OpSpec:
    return OpSpec(
        "dataTypeCast",
        CAST,
        1,
        "DataTypeCast",
        _cast_type,
        lambda args, at: args[0].astype(at["dtype"].numpy),
        attrs=("dtype",),
        egg_attrs=(("dtype", "dtype"),),
        batch=elementwise,
    )
