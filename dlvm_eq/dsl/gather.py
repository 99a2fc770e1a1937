"""`take` (numpy's `np.take` along one axis) and `x[ids]` with an integer array or tensor,
onto the IR op `take` (whose adjoint is `scatterAdd`: repeated indices accumulate):

    dq.take(emb, ids, axis=0)    # ids (2, 5) of i32: shapeCast to 10; take; shapeCast to 2 x 5 x d
    emb[ids]                     # the same, axis 0

Indices must lie in [0, size): the interpreter, eager calls and compiled code (CPU and GPU)
raise the same DlvmError otherwise (ir/ops.checked_indices). Negative indices are not wrapped.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.types import I32
from .context import shape_error
from .ops import normalize_axes, reshape, shape_of
from .primitive import bind, dtype_of
from .tensor import Tensor


def is_index_array(ids) -> bool:
    """A traced tensor or a numpy array of integers (an index for `take`, not basic indexing)."""
    if isinstance(ids, Tensor):
        return True
    return isinstance(ids, np.ndarray) and np.issubdtype(ids.dtype, np.integer)


def take(x, ids, axis=0):
    """x's entries at integer `ids` along `axis`: shape x.shape[:axis] + ids.shape +
    x.shape[axis + 1:], as numpy's take."""
    shape = tuple(shape_of(x))
    if not shape:
        raise shape_error("take: cannot index a zero-dimensional array")
    (axis,) = normalize_axes(axis, shape, "take")
    if not isinstance(ids, Tensor):
        ids = np.asarray(ids)
        if not np.issubdtype(ids.dtype, np.integer):
            raise shape_error(f"take: indices must be integers, got an array of {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= shape[axis]):
            bad = ids.flat[np.flatnonzero((ids < 0) | (ids >= shape[axis]))[0]]
            raise shape_error(
                f"take: index {int(bad)} is out of range for axis {axis} with size {shape[axis]}"
            )
        ids = ids.astype(np.int32)
    elif dtype_of(ids) is not I32:
        raise shape_error(f"take: indices must be integers, got a tensor of {dtype_of(ids)}")
    ids_shape = tuple(shape_of(ids))
    if math.prod(ids_shape) == 0:
        raise shape_error(f"take: no indices (shape {ids_shape})")
    flat = ids if len(ids_shape) == 1 else reshape(ids, (math.prod(ids_shape),))
    out = bind("take", [x, flat], name="take", promote_only=(), axis=axis)
    want = shape[:axis] + ids_shape + shape[axis + 1 :]
    return out if tuple(shape_of(out)) == want else reshape(out, want)
