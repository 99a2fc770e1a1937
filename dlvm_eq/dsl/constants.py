"""Constant arrays, as numpy and JAX name them: `zeros`, `ones`, `full`, their `_like` forms,
and `arange`. Outside a trace they are numpy arrays; inside one, tensors of the trace (a filled
array is one splat `literal`, DLVM's `0.0: <3 x 4 x f32>`, not an array of copies):

    dq.zeros((2, 3))              # float32 zeros, as JAX defaults
    dq.full((4,), 7)              # int32: the fill value's kind, unless dtype= says
    dq.arange(1, 7, 2)            # array([1, 3, 5], dtype=int32)
"""

from __future__ import annotations

import numpy as np

from ..ir.module import Const
from ..ir.types import TensorType
from .context import current_trace, shape_error, user_location
from .ops import astype, shape_of
from .primitive import bind, dtype_of, is_weak, promote, to_dtype
from .tensor import Tensor


def _shape(shape, name: str) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
        raise shape_error(f"{name}: shape {shape!r} must be non-negative ints")
    return tuple(int(d) for d in dims)


def full(shape, fill_value, dtype=None):
    """An array of `shape` filled with `fill_value` (a scalar, or a traced scalar tensor);
    the dtype is the fill value's (Python floats -> f32) unless `dtype` is given."""
    shape = _shape(shape, "full")
    dtype = to_dtype(dtype) if dtype is not None else promote([fill_value])
    if isinstance(fill_value, Tensor):
        if fill_value.shape != ():
            raise shape_error(
                f"full: the fill value must be a scalar, got shape {fill_value.shape}"
            )
        return bind("broadcast", [astype(fill_value, dtype)], name="full", shape=shape)
    if not is_weak(fill_value) and np.ndim(fill_value) != 0:
        raise shape_error(
            f"full: the fill value must be a scalar, got shape {np.shape(fill_value)}"
        )
    trace = current_trace()
    if trace is None:
        return np.full(shape, fill_value, dtype=dtype.numpy)
    value = trace.builder.emit(
        "literal",
        [],
        location=user_location(),
        value=Const.of(fill_value, dtype).value,
        type=TensorType(shape, dtype),
    )
    return Tensor(value, trace)


def zeros(shape, dtype="f32"):
    return full(shape, 0, dtype)


def ones(shape, dtype="f32"):
    return full(shape, 1, dtype)


def full_like(x, fill_value, dtype=None):
    """`full` with the shape (and, unless `dtype` says, the dtype) of `x`."""
    return full(shape_of(x), fill_value, dtype if dtype is not None else dtype_of(x))


def zeros_like(x, dtype=None):
    return full_like(x, 0, dtype)


def ones_like(x, dtype=None):
    return full_like(x, 1, dtype)


def arange(start, stop=None, step=1, dtype=None):
    """numpy's `arange` (ints -> i32, floats -> f32 unless `dtype` says); a constant, so its
    bounds must be Python numbers."""
    if stop is None:
        start, stop = 0, start
    bounds = (start, stop, step)
    if not all(is_weak(b) for b in bounds):
        raise shape_error(
            f"arange: bounds must be Python numbers, got {bounds!r:.80} (the "
            "length of an array must be known while tracing)"
        )
    if step == 0:
        raise shape_error("arange: step must not be zero")
    dtype = to_dtype(dtype) if dtype is not None else promote(list(bounds))
    values = np.arange(start, stop, step).astype(dtype.numpy)
    trace = current_trace()
    if trace is None:
        return values
    return Tensor(trace.literal(values, dtype, user_location()), trace)
