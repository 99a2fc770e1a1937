"""numpy evaluation of kernel specs: the oracle the generated code is tested against.

    >>> spec = KernelSpec("k", (3,), [KernelInput("f32")], [Load(0) * 2.0])
    >>> evaluate(spec, [np.arange(3, dtype=np.float32)])[0]
    array([0., 2., 4.], dtype=float32)

`compute="f64"` evaluates every float op in float64 (the accuracy reference for f32 kernels).
Semantics are the IR's op table's (ir/ops.py): integer `div` truncates and gives 0 for a zero
divisor, float min/max propagate NaN, `round` rounds half to even.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...ir.ops import OPS, REDUCE_COMBINATORS
from .kernel_spec import KernelSpec, ReduceSpec
from .spec import (
    BINARY_OPS,
    DLVM_NAMES,
    DTYPES,
    UNARY_OPS,
    Binary,
    Cast,
    Const,
    Load,
    Select,
    Unary,
    dtype_of,
    op_name,
    walk,
)


def _semantics(kernel_op: str):
    """The op table's numpy semantics of a kernel op (an IR op under its short name)."""
    evaluate = OPS[_IR_NAME.get(kernel_op, kernel_op)].evaluate
    return lambda *args: evaluate(list(args), {})


_IR_NAME = {short: dlvm for dlvm, short in DLVM_NAMES.items()}
UNARY_NP = {op: _semantics(op) for op in UNARY_OPS}
BINARY_NP = {op: _semantics(op) for op in BINARY_OPS}
REDUCE_NP = {op_name(n): ufunc for n, ufunc in REDUCE_COMBINATORS.items()}  # numpy ufuncs


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
                v = BINARY_NP[e.op](vals[e.a], vals[e.b])
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
