"""sort, argsort and top_k as compositions of comparisons and selects: each element's rank is
counted (how many come before it), and output position r takes the element of rank r. No new
primitive, so the adjoint follows from the ops: g at output r goes back to the source position
of the element placed there (a scatter, through the select), and no adjoint flows through the
ranks (comparisons).

    dq.sort(x, axis=-1)                 # jnp.sort: stable, ascending (descending=True too)
    dq.argsort(x)                       # i32 positions, ties in index order
    values, indices = dq.top_k(x, 3)    # jax.lax.top_k: the k largest along the last axis

Ties are stable: equal elements keep their index order (in both directions, as
jax.lax.top_k); NaN sorts after every number (numpy's order), so first when descending.
Cost: an n x n comparison per row (n the sorted axis's size), and k x n for top_k: meant for
the axes of a few thousand entries that losses and samplers sort, not for sorting long arrays.
"""

from __future__ import annotations

import numpy as np

from ..ir.types import I32
from . import ops
from .constants import arange
from .context import shape_error
from .ops import normalize_axes, shape_of


def _before(a, b, descending: bool):
    """a strictly before b in the order (NaN after every number, ascending)."""
    a_nan, b_nan = ops.not_equal(a, a), ops.not_equal(b, b)
    if descending:
        a, b, a_nan, b_nan = b, a, b_nan, a_nan
    numbers = ops.logical_and(ops.logical_not(a_nan), b_nan)
    return ops.logical_or(ops.less(a, b), numbers)


def _ranks(x, descending: bool):
    """The stable rank of every element of x's last axis, as i32: the elements strictly before
    it plus the equal ones at lower indices."""
    n = shape_of(x)[-1]
    mine = ops.reshape(x, tuple(shape_of(x)) + (1,))  # (..., i, 1)
    other = ops.reshape(x, tuple(shape_of(x)[:-1]) + (1, n))  # (..., 1, j)
    same = ops.logical_or(
        ops.equal(mine, other),
        ops.logical_and(ops.not_equal(mine, mine), ops.not_equal(other, other)),
    )
    lower = np.arange(n)[None, :] < np.arange(n)[:, None]  # j < i
    counted = ops.logical_or(_before(other, mine, descending), ops.logical_and(same, lower))
    return ops.sum(counted, axis=-1)  # bools sum as i32


def _placed(x, ranks, count: int):
    """(hit, x's row broadcast): hit[..., r, i] says element i has rank r, for r < count."""
    n = shape_of(x)[-1]
    hit = ops.equal(
        ops.reshape(ranks, tuple(shape_of(ranks)[:-1]) + (1, n)),
        ops.reshape(arange(count), (count, 1)),
    )
    return hit


def _to_last(x, axis):
    shape = tuple(shape_of(x))
    if not shape:
        raise shape_error("sort: a zero-dimensional array has no axis to sort")
    (axis,) = normalize_axes(axis, shape, "sort")
    perm = tuple(a for a in range(len(shape)) if a != axis) + (axis,)
    moved = x if axis == len(shape) - 1 else ops.transpose(x, perm)
    back = tuple(int(np.argsort(perm)[a]) for a in range(len(shape)))
    return moved, (lambda y: y if axis == len(shape) - 1 else ops.transpose(y, back))


def _gather_sorted(x, hit):
    """Row r of the result: the element of x whose rank is r (a select, then a sum of one)."""
    n = shape_of(x)[-1]
    row = ops.reshape(x, tuple(shape_of(x)[:-1]) + (1, n))
    return ops.sum(ops.where(hit, row, 0), axis=-1)


def sort(x, axis=-1, descending=False):
    """x sorted along `axis` (stable; NaN last, or first when descending)."""
    moved, back = _to_last(x, axis)
    hit = _placed(moved, _ranks(moved, descending), shape_of(moved)[-1])
    return back(_gather_sorted(moved, hit))


def argsort(x, axis=-1, descending=False):
    """The positions that sort x along `axis`, as i32 (stable)."""
    moved, back = _to_last(x, axis)
    n = shape_of(moved)[-1]
    hit = _placed(moved, _ranks(moved, descending), n)
    return back(ops.sum(ops.where(hit, arange(n), 0), axis=-1))


def top_k(x, k: int):
    """(values, indices) of the k largest entries of x's last axis, largest first (equal ones
    in index order), as jax.lax.top_k."""
    n = shape_of(x)[-1] if shape_of(x) else 0
    if not isinstance(k, (int, np.integer)) or not 0 < k <= n:
        raise shape_error(f"top_k: k must be in 1..{n}, got {k!r}")
    hit = _placed(x, _ranks(x, True), int(k))
    values = _gather_sorted(x, hit)
    indices = ops.sum(ops.where(hit, arange(n), 0), axis=-1)
    return values, ops.astype(indices, I32)
