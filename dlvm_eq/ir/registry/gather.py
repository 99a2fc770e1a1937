"""Indexed reads and writes along an axis: `take` (numpy's take) and `scatterAdd` (its adjoint).

%y = take %x: <5 x 3 x f32>, %ids: <4 x i32> along 0              // <4 x 3 x f32>
%g = scatterAdd %dy: <4 x 3 x f32>, %ids: <4 x i32> along 0 into 5  // <5 x 3 x f32>
"""

from __future__ import annotations

import numpy as np

from ..op_spec import GATHER, OpSpec, fail, tensors
from ..types import BOOL, DType
from .batch_rules import shift_axis


def _index_operand(op: str, x, ids, axis: int) -> None:
    if ids.dtype is not DType.i32 or ids.rank != 1 or ids.size == 0:
        fail(op, f"indices must be a non-empty vector of i32, got {ids}")
    if not 0 <= axis < x.rank:
        fail(op, f"axis {axis} out of range for {x}")


def _take_type(types, attrs):
    x, ids = tensors("take", types)
    k = attrs["axis"]
    _index_operand("take", x, ids, k)
    return x.with_shape(x.shape[:k] + ids.shape + x.shape[k + 1 :])


def _scatter_add_type(types, attrs):
    g, ids = tensors("scatterAdd", types)
    k, size = attrs["axis"], attrs["size"]
    _index_operand("scatterAdd", g, ids, k)
    if g.dtype is BOOL:
        fail("scatterAdd", "bool values")
    if g.shape[k] != ids.size:
        fail("scatterAdd", f"{ids.size} indices for axis {k} of {g}")
    if size < 1:
        fail("scatterAdd", f"size {size} along axis {k} is not positive")
    return g.with_shape(g.shape[:k] + (size,) + g.shape[k + 1 :])


def checked_indices(op: str, ids: np.ndarray, size: int) -> np.ndarray:
    """ids as intp, or an IRError naming the first index outside [0, size)."""
    bad = np.flatnonzero((ids < 0) | (ids >= size))
    if bad.size:
        fail(
            op,
            f"index {int(ids[bad[0]])} (position {int(bad[0])}) is out of range for an axis "
            f"of size {size}",
        )
    return ids.astype(np.intp)


def _take(args, attrs):
    x, ids = args
    k = attrs["axis"]
    return np.take(x, checked_indices("take", ids, x.shape[k]), axis=k)


def _scatter_add(args, attrs):
    g, ids = args
    k, size = attrs["axis"], attrs["size"]
    out = np.zeros(g.shape[:k] + (size,) + g.shape[k + 1 :], g.dtype)
    np.add.at(out, (slice(None),) * k + (checked_indices("scatterAdd", ids, size),), g)
    return out


def _flat_ids(bt, ids, batched_ids: bool, size: int):
    """Per-example indices (B, n) into one axis of B * size entries: ids + b * size, flattened."""
    B = bt.size
    ids = ids if batched_ids else bt.full(ids)
    offsets = bt.literal(np.arange(B, dtype=np.int32).reshape(B, 1) * size)
    flat = bt.emit("add", [ids, offsets])
    return bt.emit("shapeCast", [flat], shape=(B * ids.type.shape[1],))


def _fold_axis(bt, x, k: int):
    """A batched x (B, ..., d_k, ...) as (..., B * d_k, ...): the batch merged into axis k."""
    shape = x.type.shape[1:]
    perm = tuple(range(1, k + 1)) + (0,) + tuple(range(k + 1, len(shape) + 1))
    moved = bt.emit("transpose", [x], perm=perm)
    return bt.emit("shapeCast", [moved], shape=shape[:k] + (bt.size * shape[k],) + shape[k + 1 :])


def _unfold_axis(bt, y, k: int):
    """(..., B * n, ...) on axis k -> (B, ..., n, ...)."""
    shape = y.type.shape
    n = shape[k] // bt.size
    y = bt.emit("shapeCast", [y], shape=shape[:k] + (bt.size, n) + shape[k + 1 :])
    perm = (k,) + tuple(i for i in range(len(shape) + 1) if i != k)
    return bt.emit("transpose", [y], perm=perm)


def _batch_take(bt, op, args, batched, attrs):
    x, ids = args
    k = attrs["axis"]
    if not batched[1]:
        return shift_axis("axis", full=False)(bt, op, args, batched, attrs)
    # per-example indices: one take from x with the batch merged into axis k
    x = x if batched[0] else bt.full(x)
    size = x.type.shape[k + 1]
    out = bt.emit("take", [_fold_axis(bt, x, k), _flat_ids(bt, ids, True, size)], axis=k)
    return _unfold_axis(bt, out, k)


def _batch_scatter_add(bt, op, args, batched, attrs):
    g, ids = args
    k, size = attrs["axis"], attrs["size"]
    if not batched[1]:
        return shift_axis("axis", full=False)(bt, op, args, batched, attrs)
    g = g if batched[0] else bt.full(g)
    flat = _flat_ids(bt, ids, True, size)
    out = bt.emit("scatterAdd", [_fold_axis(bt, g, k), flat], axis=k, size=bt.size * size)
    return _unfold_axis(bt, out, k)


def _take_symbolic(sv, args, attrs, rtype):
    x, ids = args
    return np.take(x, sv.indices("take", ids), axis=attrs["axis"])


def _scatter_add_symbolic(sv, args, attrs, rtype):
    g, ids = args
    k = attrs["axis"]
    out = np.full(rtype.shape, sv.sp.S.Zero, dtype=object)
    for j, i in enumerate(sv.indices("scatterAdd", ids)):
        dst = (slice(None),) * k + (i,)
        out[dst] = out[dst] + g[(slice(None),) * k + (j,)]
    return out


def take_spec() -> OpSpec:
    # `take %x: T, %ids: <n x i32> along k`: x[..., ids, ...] on axis k (numpy's take); indices
    # outside the axis are an error (checked_indices), in compiled code too
    return OpSpec(
        "take",
        GATHER,
        2,
        "Take",
        _take_type,
        _take,
        attrs=("axis",),
        egg_attrs=(("axis", "i64"),),
        nondiff_operands=(1,),
        batch=_batch_take,
        symbolic=_take_symbolic,
    )


def scatter_add_spec() -> OpSpec:
    # `scatterAdd %g: T, %ids: <n x i32> along k into size`: zeros of `size` along k, g[..., j, ...]
    # added at ids[j] (repeated indices accumulate): take's adjoint
    return OpSpec(
        "scatterAdd",
        GATHER,
        2,
        "ScatterAdd",
        _scatter_add_type,
        _scatter_add,
        attrs=("axis", "size"),
        egg_attrs=(("axis", "i64"), ("size", "i64")),
        nondiff_operands=(1,),
        batch=_batch_scatter_add,
        symbolic=_scatter_add_symbolic,
    )
