"""Numpy references for the reference interpreter's ops, written independently of the op table,
and the helpers that run one op on sampled operands and compare (tests/test_ir_interp.py)."""

import math

import numpy as np

from dlvm_eq.ir import BOOL, F32, F64, I32, FunctionBuilder, Module, interpret

RNG = np.random.default_rng(1234)

REF_UNARY = {
    "negate": lambda x: 0 - x,
    "exp": lambda x: np.e**x,
    "log": np.log,
    "tanh": np.tanh,
    "sinh": lambda x: (np.exp(x) - np.exp(-x)) / 2,
    "cosh": lambda x: (np.exp(x) + np.exp(-x)) / 2,
    "sin": np.sin,
    "cos": np.cos,
    "tan": lambda x: np.sin(x) / np.cos(x),
    "sqrt": lambda x: x**0.5,
    "rsqrt": lambda x: x**-0.5,
    "square": lambda x: x * x,
    "sign": lambda x: (x > 0) * 1 - (x < 0) * 1,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": lambda x: np.round(x),  # half to even, like DLVM/LLVM rint
    "abs": lambda x: np.where(x < 0, -x, x),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "relu": lambda x: np.where(x > 0, x, 0),
    "log1p": lambda x: np.log(1 + x),
    "expm1": lambda x: np.exp(x) - 1,
    "softplus": lambda x: np.log(1 + np.exp(x)),
    "erf": lambda x: np.vectorize(math.erf, otypes=[np.float64])(x),
    "stopGradient": lambda x: x + 0,  # issue 31: the identity (no adjoint)
}
POSITIVE_DOMAIN = {"log", "sqrt", "rsqrt", "log1p"}


def _c_divide(a, b):
    """C-style: truncate toward zero; x / 0 is 0 (the IR's definition, like LLVM's sdiv without UB)."""
    a, b = np.broadcast_arrays(a, b)
    out = [
        0 if y == 0 else int(x / y) if abs(x) < 2**52 else 0
        for x, y in zip(a.ravel().tolist(), b.ravel().tolist())
    ]
    return np.array(out, dtype=np.int64).reshape(a.shape)


def _unsigned(x):
    return [int(v) & 0xFFFFFFFF for v in np.ravel(x)]


def _signed_words(values, shape):
    return np.array([v - (1 << 32) if v >= 1 << 31 else v for v in values], np.int64).reshape(shape)


def _xor(x, y):
    return x ^ y


def _bits(fn):
    """An i32 bit operation in Python integers on the words as unsigned (an independent
    reference for the registry's numpy)."""

    def ref(a, b):
        a, b = np.broadcast_arrays(a, b)
        out = [fn(x, y if fn is _xor else y % 32) for x, y in zip(_unsigned(a), _unsigned(b))]
        return _signed_words([v & 0xFFFFFFFF for v in out], a.shape)

    return ref


REF_BINARY = {
    "xor": _bits(_xor),
    "shiftLeft": _bits(lambda x, s: x << s),
    "shiftRightLogical": _bits(lambda x, s: x >> s),
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": lambda a, b: a / b if np.result_type(a, b).kind == "f" else _c_divide(a, b),
    "power": lambda a, b: np.exp(b * np.log(a)),
    "min": lambda a, b: np.where(a < b, a, b),
    "max": lambda a, b: np.where(a > b, a, b),
}
REF_COMPARE = {
    "equal": lambda a, b: a == b,
    "notEqual": lambda a, b: a != b,
    "lessThan": lambda a, b: a < b,
    "lessThanOrEqual": lambda a, b: a <= b,
    "greaterThan": lambda a, b: a > b,
    "greaterThanOrEqual": lambda a, b: a >= b,
}
REF_LOGIC = {"and": lambda a, b: a & b, "or": lambda a, b: a | b, "not": lambda a: ~a}

# broadcasting corner cases: scalars, (1, n) vs (m, 1), rank extension, size-1 axes, equal shapes
SHAPE_PAIRS = [
    ((), ()),
    ((), (3,)),
    ((4,), ()),
    ((1, 4), (3, 1)),
    ((3, 1), (1, 4)),
    ((4,), (2, 3, 4)),
    ((2, 1, 4), (3, 1)),
    ((3, 4), (3, 4)),
    ((1,), (2, 3)),
    ((2, 1, 1), (1, 3, 1)),
]


def run(op, operand_types, arrays, float64=False, **attrs):
    """Build @f with one `op` instruction over parameters of the given types and run it."""
    b = FunctionBuilder("f", operand_types)
    out = b.emit(op, list(b.params), **attrs)
    m = Module("t")
    m.add(b.finish(out))
    return interpret(m, "f", *arrays, float64=float64)


def sample(shape, dtype, positive=False):
    if dtype is BOOL:
        return RNG.random(shape) < 0.5
    if dtype is I32:
        return RNG.integers(-6, 7, size=shape).astype(np.int32)
    a = RNG.standard_normal(shape)
    if positive:
        a = np.abs(a) + 0.1
    return a.astype(dtype.numpy)


def close(got, want, dtype):
    want = np.asarray(want)
    assert np.shape(got) == want.shape
    if dtype in (F32, F64):
        rtol = 1e-5 if dtype is F32 else 1e-12
        np.testing.assert_allclose(
            np.asarray(got, np.float64), want.astype(np.float64), rtol=rtol, atol=rtol
        )
    else:
        np.testing.assert_array_equal(got, want)
