"""numpy array functions that are compositions of existing ops (no new primitive, so their
adjoints come from the ops they are made of):

    dq.argmax(x, axis=-1)      # min over the axis of where(x == max, index, n): the first maximum
    dq.clip(x, 0.0, 6.0)       # minimum(maximum(x, 0), 6)
    dq.pad(x, ((0, 0), (1, 2)))  # concatenate constant blocks before and after along each axis

and `cumsum`, which is its own IR op (running sums are no composition of the others).

argmax/argmin return i32 indices: no gradient flows through them (integer results), as in JAX
where their derivative is zero. As numpy, NaN counts as the extreme (its first index wins).
clip at a bound passes half of the gradient (maximum/minimum split ties equally, as JAX's
`jnp.clip` built on them does).
"""

from __future__ import annotations

import numbers

import numpy as np

from ..ir.types import BOOL, I32
from .context import shape_error
from .ops import (
    astype,
    concatenate,
    equal,
    logical_or,
    max,
    maximum,
    min,
    minimum,
    normalize_axes,
    not_equal,
    reshape,
    shape_of,
    where,
)
from .primitive import bind, dtype_of, lift_value
from .tensor import Tensor


def _one_axis(x, axis, name: str):
    """(x, its shape, axis): for axis None, x flattened and axis 0, as numpy does."""
    shape = tuple(shape_of(x))
    if axis is None:
        shape = (int(np.prod(shape, dtype=np.int64)),)
        x, axis = reshape(x, shape), 0
    if not shape:
        raise shape_error(f"{name}: a zero-dimensional array has no axis")
    (axis,) = normalize_axes(axis, shape, name)
    return x, shape, axis


def _arg_extreme(x, axis, keepdims: bool, extreme, name: str):
    x, shape, axis = _one_axis(x, axis, name)
    n = shape[axis]
    iota = np.arange(n, dtype=np.int32).reshape([n if i == axis else 1 for i in range(len(shape))])
    hit = logical_or(equal(x, extreme(x, axis=axis, keepdims=True)), not_equal(x, x))  # x != x: NaN
    return min(where(hit, iota, n), axis=axis, keepdims=keepdims)


def argmax(x, axis=None, keepdims=False):
    """Index of the first maximum along `axis` (of the flattened array for None), as i32."""
    return _arg_extreme(x, axis, keepdims, max, "argmax")


def argmin(x, axis=None, keepdims=False):
    """Index of the first minimum along `axis` (of the flattened array for None), as i32."""
    return _arg_extreme(x, axis, keepdims, min, "argmin")


def cumsum(x, axis=None, reverse=False):
    """Running sums along `axis` (of the flattened array for None), as numpy's cumsum; with
    reverse, from the end (the IR op `cumsum`, whose adjoint is the cumsum the other way)."""
    x, _, axis = _one_axis(x, axis, "cumsum")
    if dtype_of(x) is BOOL:
        x = astype(x, I32)  # numpy sums bools as integers
    return bind("cumsum", [x], name="cumsum", axis=axis, reverse=bool(reverse))


def clip(x, a_min=None, a_max=None):
    """x limited to [a_min, a_max] elementwise (either bound may be None, not both)."""
    if a_min is None and a_max is None:
        raise shape_error("clip: give a_min, a_max or both")
    if a_min is not None:
        x = maximum(x, a_min)
    return x if a_max is None else minimum(x, a_max)


def _pad_widths(pad_width, rank: int) -> list[tuple[int, int]]:
    w = np.asarray(pad_width)
    if not np.issubdtype(w.dtype, np.integer) or (w < 0).any():
        raise shape_error(f"pad: pad_width {pad_width!r} must be non-negative integers")
    try:
        w = np.broadcast_to(w.reshape(-1, 2) if w.ndim == 2 else w, (rank, 2))
    except ValueError:
        raise shape_error(f"pad: pad_width {pad_width!r} does not fit {rank} axes") from None
    return [(int(a), int(b)) for a, b in w]


def pad(x, pad_width, mode="constant", constant_values=0):
    """numpy's pad with a constant: pad_width an int, (before, after), or one pair per axis."""
    if mode != "constant":
        raise shape_error(f"pad: mode {mode!r} is not supported (only 'constant')")
    if not isinstance(constant_values, (numbers.Number, np.generic)):
        raise shape_error("pad: constant_values must be one number")
    shape = list(shape_of(x))
    if not shape:
        raise shape_error("pad: a zero-dimensional array cannot be padded")
    value = np.asarray(constant_values, dtype_of(x).numpy)
    if isinstance(x, Tensor):
        value = Tensor(lift_value(value, x.trace), x.trace)  # one scalar literal, broadcast
    for axis, (before, after) in enumerate(_pad_widths(pad_width, len(shape))):
        parts = []
        for count in (before, after):
            block = shape[:axis] + [count] + shape[axis + 1 :]
            parts.append(
                bind("broadcast", [value], name="pad", shape=tuple(block)) if count else None
            )
        if parts[0] is not None or parts[1] is not None:
            x = concatenate([p for p in (parts[0], x, parts[1]) if p is not None], axis=axis)
            shape[axis] += before + after
    return x
