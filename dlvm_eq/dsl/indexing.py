"""NumPy basic indexing on DSL tensors: `x[1:3]`, `x[:, -1]`, `h[..., :n]`, `x[None]`, and
`split`. Each sliced axis is one IR `slice` op; an integer index is a slice of length 1 whose
axis `squeezeShape` drops; `None` adds an axis with `padShape`:

    x[:, 2:6]     # slice %x along 1 from 2 to 6
    x[0]          # slice %x along 0 from 0 to 1; squeezeShape at 0
    dq.split(z, 4, axis=-1)    # four slices of equal size (LSTM gates)

Bounds follow numpy: negative from the end, slice bounds clamped to the axis; a positive step
`x[1:7:3]` is a strided `slice ... by 3` (read in place by compiled code), a negative step
`x[::-1]` a `take` of the indices in reverse. An integer array or tensor alone, `x[ids]`, is a
`take` (dsl/gather.py). Not supported (a ShapeError at the user's line): empty slices, boolean
indices, arrays mixed with other entries.
"""

from __future__ import annotations

import numbers
from itertools import pairwise

import numpy as np

from .context import shape_error
from .gather import is_index_array, take
from .primitive import bind, check_operand
from .tensor import Tensor


def _shape(x) -> tuple[int, ...]:
    if isinstance(x, Tensor):
        return tuple(x.shape)
    check_operand(x)
    return np.shape(x)


def _check_entry(e, shape) -> None:
    if e is None or e is Ellipsis or isinstance(e, slice):
        return
    if isinstance(e, (bool, np.bool_)):
        raise shape_error(
            f"indexing shape {shape} with a bool is not supported (boolean masks "
            "select data-dependent shapes; use dq.where)"
        )
    if isinstance(e, Tensor):
        raise shape_error(
            f"indexing shape {shape} by a traced tensor is supported only as the "
            "whole index, x[ids] (dq.take); here use dq.take for each axis"
        )
    if isinstance(e, (numbers.Integral, np.integer)):
        return
    raise shape_error(
        f"indexing shape {shape} with {type(e).__name__} {e!r} is not supported: "
        "only ints, slices, ... and None, or one integer array "
        "as the whole index (x[ids])"
    )


def _expand(index, shape) -> list:
    """The index as one entry per axis (plus Nones): `...` and missing trailing axes -> `:`."""
    entries = list(index) if isinstance(index, tuple) else [index]
    for e in entries:
        _check_entry(e, shape)
    if sum(e is Ellipsis for e in entries) > 1:
        raise shape_error(f"indexing shape {shape}: an index can only have a single ellipsis (...)")
    used = sum(e is not None and e is not Ellipsis for e in entries)
    if used > len(shape):
        raise shape_error(
            f"too many indices for shape {shape}: {used} indexed axes, {len(shape)} axes"
        )
    fill = [slice(None)] * (len(shape) - used)
    if Ellipsis in entries:
        i = next(i for i, e in enumerate(entries) if e is Ellipsis)
        return entries[:i] + fill + entries[i + 1 :]
    return entries + fill


def _bounds(e, n: int, axis: int, shape) -> tuple[int, int, int, bool]:
    """(lo, hi, step, squeeze) of entry e on an axis of size n."""
    if isinstance(e, slice):
        if e.step is not None and (
            not isinstance(e.step, (numbers.Integral, np.integer)) or e.step == 0
        ):
            raise shape_error(
                f"indexing shape {shape}: slice step {e.step} on axis {axis} is not "
                "supported (integer steps other than 0)"
            )
        lo, hi, step = e.indices(n)
        if not len(range(lo, hi, step)):
            raise shape_error(
                f"indexing shape {shape}: the slice {_text(e)} of axis {axis} "
                f"(size {n}) is empty; empty tensors are not supported"
            )
        return lo, hi, step, False
    i = int(e)
    if not -n <= i < n:
        raise shape_error(
            f"index {i} is out of bounds for axis {axis} with size {n} (shape {shape})"
        )
    i %= n
    return i, i + 1, 1, True


def _text(s: slice) -> str:
    return f"{'' if s.start is None else s.start}:{'' if s.stop is None else s.stop}"


def getitem(x, index):
    """x[index] with numpy's basic indexing (see the module docstring); an integer array or
    tensor alone is a `take` along axis 0 (dsl/gather.py)."""
    if is_index_array(index):
        return take(x, index, axis=0)
    shape = _shape(x)
    entries = _expand(index, shape)
    out, squeeze, new_axes = x, [], []
    axis, out_rank = 0, 0
    for e in entries:
        if e is None:
            new_axes.append(out_rank)
            out_rank += 1
            continue
        n = shape[axis]
        lo, hi, step, drop = _bounds(e, n, axis, shape)
        if step != 1 and len(range(lo, hi, step)) == 1:
            hi, step = lo + 1, 1  # one entry: a plain slice
        if step < 0:  # x[::-k]: a take of the indices in reverse (its adjoint adds them back)
            out = take(out, np.arange(lo, hi, step), axis=axis)
        elif step != 1:
            out = bind("slice", [out], name="indexing", axis=axis, lo=lo, hi=hi, step=step)
        elif (lo, hi) != (0, n):
            out = bind("slice", [out], name="indexing", axis=axis, lo=lo, hi=hi)
        if drop:
            squeeze.append(axis)
        else:
            out_rank += 1
        axis += 1
    for a in reversed(squeeze):
        out = bind("squeezeShape", [out], name="indexing", at=a)
    for a in new_axes:
        out = bind("padShape", [out], name="indexing", at=a)
    if out is x and not isinstance(x, Tensor):
        out = np.array(x)  # numpy's x[:] is a view; eager DSL results are fresh arrays
    return out


def split(x, indices_or_sections, axis=0) -> list:
    """numpy.split: `n` equal parts along `axis`, or the parts between the given indices."""
    shape = _shape(x)
    if not shape:
        raise shape_error("split: a zero-dimensional array cannot be split")
    if not -len(shape) <= axis < len(shape):
        raise shape_error(f"split: axis {axis} out of range for shape {shape}")
    axis %= len(shape)
    n = shape[axis]
    if isinstance(indices_or_sections, (numbers.Integral, np.integer)):
        k = int(indices_or_sections)
        if k <= 0 or n % k:
            raise shape_error(
                f"split: axis {axis} of shape {shape} (size {n}) does not divide "
                f"into {k} equal parts"
            )
        cuts = [n // k * i for i in range(1, k)]
    else:
        cuts = [int(c) for c in indices_or_sections]
    bounds = [0] + [min(max(c + n if c < 0 else c, 0), n) for c in cuts] + [n]
    lead = (slice(None),) * axis
    return [getitem(x, lead + (slice(lo, hi),)) for lo, hi in pairwise(bounds)]
