"""numpy evaluation of kernel specs: the oracle the generated code is tested against.

    >>> spec = KernelSpec("k", (3,), [KernelInput("f32")], [Load(0) * 2.0])
    >>> evaluate(spec, [np.arange(3, dtype=np.float32)])[0]
    array([0., 2., 4.], dtype=float32)

`compute="f64"` evaluates every float op in float64 (the accuracy reference for f32 kernels).
Semantics follow the IR's op table: integer `div` truncates and gives 0 for a zero divisor,
float min/max propagate NaN, `round` rounds half to even.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .kernel import (DTYPES, Binary, Cast, Const, KernelSpec, Load, ReduceSpec, Select, Unary,
                     dtype_of, walk)


def _erf(x):
    from scipy.special import erf   # imported on first use (~0.2 s)
    return erf(x)


def _int_div(a, b):
    with np.errstate(all="ignore"):
        q = np.trunc(np.true_divide(a, np.where(b == 0, 1, b)))
    return np.where(b == 0, 0, q).astype(a.dtype)


UNARY_NP = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "tanh": np.tanh, "sinh": np.sinh,
    "cosh": np.cosh, "sin": np.sin, "cos": np.cos, "tan": np.tan, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "square": np.square, "sign": np.sign,
    "floor": np.floor, "ceil": np.ceil, "round": np.rint, "abs": np.abs,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, np.zeros((), x.dtype)), "log1p": np.log1p, "expm1": np.expm1,
    "softplus": lambda x: np.logaddexp(np.zeros((), x.dtype), x), "not": np.logical_not,
    "erf": lambda x: _erf(x),
}
BINARY_NP = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "pow": np.power,
    "min": np.minimum, "max": np.maximum, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "and": np.logical_and,
    "or": np.logical_or,
}
REDUCE_NP = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _view(arr: np.ndarray, inp, shape) -> np.ndarray:
    flat = np.ascontiguousarray(arr).reshape(-1)
    if inp.strides is None:
        return flat.reshape(shape)
    return as_strided(flat, shape, tuple(s * flat.itemsize for s in inp.strides), writeable=False)


def _eval_exprs(roots, dtypes, views, compute: str | None):
    """Evaluate resolved expressions on numpy views; float ops in `compute` dtype if given."""
    def ftype(dt):
        return DTYPES[compute] if compute and dt in ("f32", "f64") else DTYPES[dt]

    vals: dict = {}
    with np.errstate(all="ignore"):
        for e in walk(roots):
            dt = dtype_of(e, dtypes)
            if isinstance(e, Load):
                v = views[e.index].astype(ftype(dt))
            elif isinstance(e, Const):
                v = np.asarray(e.value, dtype=ftype(dt))
            elif isinstance(e, Unary):
                v = UNARY_NP[e.op](vals[e.x])
            elif isinstance(e, Binary):
                a, b = vals[e.a], vals[e.b]
                v = _int_div(a, b) if e.op == "div" and a.dtype.kind == "i" else (
                    np.true_divide(a, b) if e.op == "div" else BINARY_NP[e.op](a, b))
            elif isinstance(e, Select):
                v = np.where(vals[e.cond], vals[e.a], vals[e.b])
            elif isinstance(e, Cast):
                v = vals[e.x].astype(ftype(e.dtype))
            vals[e] = np.asarray(v).astype(ftype(dt), copy=False)
    return [vals[r] for r in roots]


def evaluate(spec, arrays, compute: str | None = None) -> list[np.ndarray]:
    """Outputs of a KernelSpec (a list) or of a ReduceSpec (a one-element list)."""
    views = [_view(a, inp, spec.shape) for a, inp in zip(arrays, spec.inputs)]
    if isinstance(spec, KernelSpec):
        outs = _eval_exprs(list(spec.outputs), spec.input_dtypes, views, compute)
        return [np.broadcast_to(o, spec.shape).copy() for o in outs]
    assert isinstance(spec, ReduceSpec)
    (body,) = _eval_exprs([spec.body], spec.input_dtypes, views, compute)
    body = np.broadcast_to(body, spec.shape)
    with np.errstate(all="ignore"):
        out = REDUCE_NP[spec.op].reduce(body, axis=spec.axes, initial=spec.init)
    return [np.asarray(out, dtype=body.dtype).reshape(spec.out_shape)]

