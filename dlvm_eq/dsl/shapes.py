"""numpy's shape functions as compositions of existing ops (a reshape, a broadcast, a `take`),
so each adjoint comes from the ops it is made of:

    dq.squeeze(x, 1); dq.expand_dims(x, (0, -1))    # shapeCast
    dq.broadcast_to(x, (4, 3))                      # shapeCast + broadcast (adjoint: a sum)
    dq.tile(x, (2, 1)); dq.repeat(x, 3, axis=0)     # broadcast along a new axis, merged by reshape
    dq.flip(x, 0)                                   # take with the indices reversed
    dq.triu(x, 1); dq.tril(x); dq.eye(3)            # where with a constant mask; a constant
    dq.take_along_axis(logp, labels[:, None], 1)    # one take of the flattened array

Indices (take_along_axis) must lie in [-size, size), negative ones counted from the end as
numpy does; others raise (as dq.take: at trace time for constants, at run time for tensors),
where JAX clamps or fills.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.types import F32, I32
from .context import current_trace, shape_error, user_location
from .gather import take
from .ops import add, astype, less, multiply, normalize_axes, reshape, shape_of, where
from .primitive import bind, dtype_of, to_dtype
from .tensor import Tensor


def squeeze(x, axis=None):
    """x without the axes of size 1 (all of them for None), as numpy's squeeze."""
    shape = tuple(shape_of(x))
    axes = (
        tuple(i for i, d in enumerate(shape) if d == 1)
        if axis is None
        else normalize_axes(axis, shape, "squeeze")
    )
    for a in axes:
        if shape[a] != 1:
            raise shape_error(f"squeeze: axis {a} of shape {shape} has size {shape[a]}, not 1")
    return reshape(x, tuple(d for i, d in enumerate(shape) if i not in axes))


def expand_dims(x, axis):
    """x with new axes of size 1 at `axis` (positions in the result), as numpy's expand_dims."""
    shape = tuple(shape_of(x))
    axes = normalize_axes(axis, (1,) * (len(shape) + len(np.atleast_1d(axis))), "expand_dims")
    out, rest = [], iter(shape)
    for i in range(len(shape) + len(axes)):
        out.append(1 if i in axes else next(rest))
    return reshape(x, tuple(out))


def broadcast_to(x, shape):
    """x broadcast to `shape` by numpy's rules (leading axes added, size-1 axes stretched)."""
    old = tuple(shape_of(x))
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    padded = (1,) * (len(shape) - len(old)) + old
    if len(old) > len(shape) or any(a not in (1, b) for a, b in zip(padded, shape)):
        raise shape_error(f"broadcast_to: cannot broadcast shape {old} to {shape}")
    if padded != old:
        x = reshape(x, padded)
    return x if padded == shape else bind("broadcast", [x], name="broadcast_to", shape=shape)


def tile(x, reps):
    """x repeated `reps` times along each axis, as numpy's tile: every axis d gets a new axis
    of size r before it, broadcast, then the two are merged."""
    reps = (reps,) if isinstance(reps, (int, np.integer)) else tuple(int(r) for r in reps)
    shape = tuple(shape_of(x))
    n = max(len(shape), len(reps))
    shape, reps = (1,) * (n - len(shape)) + shape, (1,) * (n - len(reps)) + reps
    if any(r < 1 for r in reps):
        raise shape_error(
            f"tile: repetitions {reps} must be positive (empty arrays are not supported)"
        )
    interleaved = tuple(v for r, d in zip(reps, shape) for v in (1, d))
    wide = tuple(v for r, d in zip(reps, shape) for v in (r, d))
    out = broadcast_to(reshape(x, interleaved), wide)
    return reshape(out, tuple(r * d for r, d in zip(reps, shape)))


def repeat(x, repeats, axis=None):
    """Each element repeated along `axis` (the flattened array for None), as numpy's repeat:
    an int by a broadcast along a new axis after it, a sequence of counts by a `take`."""
    if axis is None:
        x, axis = reshape(x, (math.prod(shape_of(x)),)), 0
    shape = tuple(shape_of(x))
    (axis,) = normalize_axes(axis, shape, "repeat")
    if isinstance(repeats, (int, np.integer)):
        if repeats < 1:
            raise shape_error(f"repeat: repeats must be positive, got {repeats}")
        split = shape[: axis + 1] + (1,) + shape[axis + 1 :]
        wide = shape[: axis + 1] + (int(repeats),) + shape[axis + 1 :]
        out = broadcast_to(reshape(x, split), wide)
        return reshape(out, shape[:axis] + (shape[axis] * int(repeats),) + shape[axis + 1 :])
    counts = np.asarray(repeats)
    if counts.shape != (shape[axis],) or (counts < 0).any():
        raise shape_error(
            f"repeat: {shape[axis]} non-negative counts expected along axis {axis}, got {repeats!r}"
        )
    return take(x, np.repeat(np.arange(shape[axis]), counts), axis=axis)


def flip(x, axis=None):
    """x with the order of the entries along `axis` (all axes for None) reversed."""
    shape = tuple(shape_of(x))
    for a in normalize_axes(axis, shape, "flip"):
        if shape[a] > 1:
            x = take(x, np.arange(shape[a] - 1, -1, -1), axis=a)
    return x


def _band(x, k: int, upper: bool, name: str):
    shape = tuple(shape_of(x))
    if len(shape) < 2:
        raise shape_error(f"{name}: needs at least 2 dimensions, got shape {shape}")
    m, n = shape[-2:]
    mask = (np.triu if upper else np.tril)(np.ones((m, n), dtype=bool), k)
    return where(mask, x, 0)


def triu(x, k=0):
    """x with the entries below the k-th diagonal of the last two axes set to zero."""
    return _band(x, k, True, "triu")


def tril(x, k=0):
    """x with the entries above the k-th diagonal of the last two axes set to zero."""
    return _band(x, k, False, "tril")


def eye(n, m=None, k=0, dtype=F32):
    """The n x m identity (ones on the k-th diagonal), a constant (f32 unless dtype says)."""
    values = np.eye(n, m, k, dtype=to_dtype(dtype).numpy)
    trace = current_trace()
    if trace is None:
        return values
    return Tensor(trace.literal(values, to_dtype(dtype), user_location()), trace)


def take_along_axis(x, indices, axis):
    """x's entries at `indices` along `axis`, as numpy's take_along_axis: indices has x's rank,
    and its other axes broadcast against x's. The flat position of each entry,
    indices * stride + the offsets of the other axes, reads the flattened x with one `take`
    (whose adjoint adds back at those positions)."""
    shape = tuple(shape_of(x))
    ishape = tuple(shape_of(indices))
    if len(ishape) != len(shape):
        raise shape_error(
            f"take_along_axis: indices of shape {ishape} need the rank of x, shape {shape}"
        )
    (axis,) = normalize_axes(axis, shape, "take_along_axis")
    if dtype_of(indices).is_float:
        raise shape_error("take_along_axis: indices must be integers")
    out = tuple(
        i if a == axis else (s if i == 1 else i) for a, (s, i) in enumerate(zip(shape, ishape))
    )
    if any(a != axis and i not in (1, s) for a, (s, i) in enumerate(zip(shape, ishape))):
        raise shape_error(
            f"take_along_axis: indices of shape {ishape} do not fit x of shape {shape}"
        )
    strides = [math.prod(shape[a + 1 :]) for a in range(len(shape))]
    offsets = np.zeros(out, np.int64)
    for a, n in enumerate(out):
        if a != axis:
            offsets = offsets + (np.arange(n) * strides[a]).reshape(
                [n if b == a else 1 for b in range(len(out))]
            )
    n = shape[axis]
    if isinstance(indices, Tensor):
        ids = broadcast_to(astype(indices, I32), out)
        ids = where(less(ids, 0), add(ids, n), ids)  # numpy's negative indices, from the end
        flat = add(multiply(ids, strides[axis]), offsets.astype(np.int32))
    else:
        ids = np.broadcast_to(np.asarray(indices), out)
        if ids.size and (ids.min() < -n or ids.max() >= n):
            raise shape_error(
                f"take_along_axis: an index is out of range for axis {axis} with size {shape[axis]}"
            )
        flat = ((ids % n) * strides[axis] + offsets).astype(np.int32)
    if math.prod(shape) >= 2**31:
        raise shape_error("take_along_axis: x has too many entries for i32 positions")
    return reshape(take(reshape(x, (math.prod(shape),)), flat, axis=0), out)
