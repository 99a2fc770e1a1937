"""Layout ops: transpose, shape casts, broadcast, concatenate, slices. Views (LAYOUT) keep every
element and fuse into their readers; slices (SLICE) copy part of a buffer.

    %t = transpose %x: <2 x 3 x f32>                  // <3 x 2 x f32>
    %s = slice %x: <4 x 6 x f32> along 1 from 2 to 6 by 2   // <4 x 2 x f32>
"""

from __future__ import annotations

import numpy as np

from ..op_spec import LAYOUT, SLICE, VIEW_COST, OpSpec, fail, tensors
from ..types import BOOL, broadcast_shapes
from .batch_rules import shape_attr, shift_axis


def transpose_perm(rank: int, attrs: dict) -> tuple[int, ...]:
    perm = attrs.get("perm")
    return tuple(perm) if perm is not None else tuple(reversed(range(rank)))


def _transpose_type(types, attrs):
    (a,) = tensors("transpose", types)
    perm = transpose_perm(a.rank, attrs)
    if sorted(perm) != list(range(a.rank)):
        fail("transpose", f"{list(perm)} is not a permutation of the {a.rank} axes of {a}")
    return a.with_shape(tuple(a.shape[p] for p in perm))


def _batch_transpose(bt, op, args, batched, attrs):
    (x,) = args
    perm = transpose_perm(x.type.rank - 1, attrs)
    return bt.emit("transpose", [x], perm=(0, *(p + 1 for p in perm)))


def _shape_cast_type(types, attrs):
    (a,) = tensors("shapeCast", types)
    shape = tuple(attrs["shape"])
    if int(np.prod(shape, dtype=np.int64)) != a.size:
        fail("shapeCast", f"cannot cast {a} ({a.size} elements) to shape {shape}")
    return a.with_shape(shape)


def _pad_shape_type(types, attrs):
    (a,) = tensors("padShape", types)
    at = attrs["at"]
    if not 0 <= at <= a.rank:
        fail("padShape", f"axis {at} out of range for {a}")
    return a.with_shape(a.shape[:at] + (1,) + a.shape[at:])


def _squeeze_shape_type(types, attrs):
    (a,) = tensors("squeezeShape", types)
    at = attrs["at"]
    if not 0 <= at < a.rank or a.shape[at] != 1:
        fail("squeezeShape", f"axis {at} of {a} is not of size 1")
    return a.with_shape(a.shape[:at] + a.shape[at + 1 :])


def _broadcast_type(types, attrs):
    (a,) = tensors("broadcast", types)
    shape = tuple(attrs["shape"])
    if broadcast_shapes(a.shape, shape) != shape:
        fail("broadcast", f"cannot broadcast {a} to shape {shape}")
    return a.with_shape(shape)


def _concatenate_type(types, attrs):
    ts = tensors("concatenate", types)
    if not ts:
        fail("concatenate", "expected at least one operand")
    axis = attrs["axis"]
    first = ts[0]
    if not 0 <= axis < first.rank:
        fail("concatenate", f"axis {axis} out of range for {first}")
    for t in ts[1:]:
        if (
            t.dtype != first.dtype
            or t.rank != first.rank
            or any(t.shape[i] != first.shape[i] for i in range(t.rank) if i != axis)
        ):
            fail("concatenate", f"operands {first} and {t} differ outside axis {axis}")
    total = sum(t.shape[axis] for t in ts)
    return first.with_shape(first.shape[:axis] + (total,) + first.shape[axis + 1 :])


def _slice_type(types, attrs):
    (a,) = tensors("slice", types)
    k, lo, hi, step = attrs["axis"], attrs["lo"], attrs["hi"], attrs.get("step", 1)
    if not 0 <= k < a.rank:
        fail("slice", f"axis {k} out of range for {a}")
    if not 0 <= lo < hi <= a.shape[k]:
        fail("slice", f"range {lo} to {hi} is empty or outside axis {k} of {a} (0 to {a.shape[k]})")
    if step < 1:
        fail("slice", f"step {step} is not positive")
    return a.with_shape(a.shape[:k] + (len(range(lo, hi, step)),) + a.shape[k + 1 :])


def slice_index(rank: int, attrs: dict) -> tuple:
    """The numpy index of a slice op: x[slice_index(x.ndim, attrs)]."""
    return (
        (slice(None),) * attrs["axis"]
        + (slice(attrs["lo"], attrs["hi"], attrs.get("step", 1)),)
        + (slice(None),) * (rank - attrs["axis"] - 1)
    )


def _slice_scatter_type(types, attrs):
    (g,) = tensors("sliceScatter", types)
    k, lo, step, size = attrs["axis"], attrs["lo"], attrs["step"], attrs["size"]
    if not 0 <= k < g.rank:
        fail("sliceScatter", f"axis {k} out of range for {g}")
    if step < 1:
        fail("sliceScatter", f"step {step} is not positive")
    if g.dtype is BOOL:
        fail("sliceScatter", "bool values")
    last = lo + (g.shape[k] - 1) * step
    if last >= size:
        fail("sliceScatter", f"{g.shape[k]} entries from {lo} by {step} do not fit in size {size}")
    return g.with_shape(g.shape[:k] + (size,) + g.shape[k + 1 :])


def scatter_slice(g: np.ndarray, attrs: dict) -> tuple:
    """(result shape, numpy index of g's entries in it) of a sliceScatter."""
    k, lo, step = attrs["axis"], attrs["lo"], attrs["step"]
    hi = lo + (g.shape[k] - 1) * step + 1
    return g.shape[:k] + (attrs["size"],) + g.shape[k + 1 :], (slice(None),) * k + (
        slice(lo, hi, step),
    )


def _slice_scatter(args, attrs):
    (g,) = args
    shape, index = scatter_slice(g, attrs)
    out = np.zeros(shape, g.dtype)
    out[index] = g
    return out


def transpose_spec() -> OpSpec:
    return OpSpec(
        "transpose",
        LAYOUT,
        1,
        "Transpose",
        _transpose_type,
        lambda args, at: np.transpose(  # a copy; ascontiguousarray would make a scalar 1-D
            args[0], transpose_perm(args[0].ndim, at)
        ).copy(),
        attrs=("perm",),
        egg_attrs=(("perm", "IVec"),),
        batch=_batch_transpose,
    )


def view_specs() -> list[OpSpec]:
    """shapeCast, padShape, squeezeShape, broadcast: views that fuse into their readers."""
    return [
        OpSpec(
            "shapeCast",
            LAYOUT,
            1,
            "ShapeCast",
            _shape_cast_type,
            lambda args, at: np.reshape(args[0], tuple(at["shape"])),
            attrs=("shape",),
            egg_attrs=(("shape", "IVec"),),
            cost=VIEW_COST,
            batch=shape_attr("shape"),
        ),
        OpSpec(
            "padShape",
            LAYOUT,
            1,
            "PadShape",
            _pad_shape_type,
            lambda args, at: np.expand_dims(args[0], at["at"]),
            attrs=("at",),
            egg_attrs=(("at", "i64"),),
            cost=VIEW_COST,
            batch=shift_axis("at"),
        ),
        OpSpec(
            "squeezeShape",
            LAYOUT,
            1,
            "SqueezeShape",
            _squeeze_shape_type,
            lambda args, at: np.squeeze(args[0], at["at"]),
            attrs=("at",),
            egg_attrs=(("at", "i64"),),
            cost=VIEW_COST,
            batch=shift_axis("at"),
        ),
        # Implicit broadcasts are explicit in the e-graph; the unloader may print them back as this op.
        OpSpec(
            "broadcast",
            LAYOUT,
            1,
            "Broadcast",
            _broadcast_type,
            lambda args, at: np.broadcast_to(args[0], tuple(at["shape"])).copy(),
            attrs=("shape",),
            egg_attrs=(("shape", "IVec"),),
            cost=VIEW_COST,
            batch=shape_attr("shape"),
        ),
    ]


def concatenate_spec() -> OpSpec:
    return OpSpec(
        "concatenate",
        LAYOUT,
        None,
        "Concatenate",
        _concatenate_type,
        lambda args, at: np.concatenate(args, axis=at["axis"]),
        attrs=("axis",),
        egg_attrs=(("axis", "i64"),),  # binary in the e-graph: a chain of them
        batch=shift_axis("axis"),
    )


def slice_spec() -> OpSpec:
    # `slice %x: T along k from lo to hi [by s]`: x[..., lo:hi:s, ...] on axis k (lo < hi, s >= 1;
    # the attribute `step` is absent for 1). The e-graph spells a step > 1 StridedSlice.
    return OpSpec(
        "slice",
        SLICE,
        1,
        "Slice",
        _slice_type,
        lambda args, at: args[0][slice_index(args[0].ndim, at)].copy(),
        attrs=("axis", "lo", "hi", "step"),
        egg_attrs=(("axis", "i64"), ("lo", "i64"), ("hi", "i64")),  # step > 1: StridedSlice
        batch=shift_axis("axis"),
    )


def _slice_scatter_symbolic(sv, args, attrs, rtype):
    (g,) = args
    shape, index = scatter_slice(g, attrs)
    out = np.full(shape, sv.sp.S.Zero, dtype=object)
    out[index] = g
    return out


def slice_scatter_spec() -> OpSpec:
    # `sliceScatter %g: T along k from lo by s into size`: zeros of `size` along k with g at
    # lo, lo + s, ...: a strided slice's adjoint
    return OpSpec(
        "sliceScatter",
        SLICE,
        1,
        "SliceScatter",
        _slice_scatter_type,
        _slice_scatter,
        attrs=("axis", "lo", "step", "size"),
        egg_attrs=(("axis", "i64"), ("lo", "i64"), ("step", "i64"), ("size", "i64")),
        batch=shift_axis("axis"),
        symbolic=_slice_scatter_symbolic,
    )
