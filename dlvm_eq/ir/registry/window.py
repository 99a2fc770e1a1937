"""Convolution and pooling (NCHW, torch's semantics): the rows of the window family, whose type
rules and array algorithms live in ir/window_ops.py (shared with codegen's im2col plan).

Under vmap a batch of images is a bigger batch of images: the batch axis folds into N; with
per-example weights (or weight gradients: DP-SGD) it folds into the channels as more groups.
"""

from __future__ import annotations

import numpy as np

from .. import window_ops
from ..op_spec import WINDOW, OpSpec, pascal
from .window_semantics import SYMBOLIC

# operands that are images (N, C, H, W) whose N a vmap batch folds into, when the weights are
# not batched
IMAGES = {
    "conv2d": (0,),
    "conv2dBackwardInput": (0,),
    "maxPool2d": (0,),
    "maxPool2dBackward": (0, 1),
    "maxPool2dGather": (0, 1),
    "avgPool2d": (0,),
    "avgPool2dBackward": (0,),
}
# convolutions whose weights (or weight gradient) are per example: the batch folds into the
# channels instead, as B times more groups (one group's weights per example)
GROUPED = ("conv2d", "conv2dBackwardInput", "conv2dBackwardWeight")


def _into_channels(bt, x, batched: bool):
    """An image batch (B, N, C, H, W) as (N, B * C, H, W): example b's channels b*C ... ."""
    x = x if batched else bt.full(x)
    B, n, c = x.type.shape[:3]
    moved = bt.emit("transpose", [x], perm=(1, 0, 2, 3, 4))
    return bt.emit("shapeCast", [moved], shape=(n, B * c) + x.type.shape[3:])


def _out_of_channels(bt, y):
    n, bc = y.type.shape[:2]
    B = bt.size
    y = bt.emit("shapeCast", [y], shape=(n, B, bc // B) + y.type.shape[2:])
    return bt.emit("transpose", [y], perm=(1, 0, 2, 3, 4))


def _batch_grouped(bt, op, args, batched, attrs):
    """Per-example weights: one convolution with B times the groups."""
    B = bt.size
    grouped = {**attrs, "groups": attrs["groups"] * B}
    if op == "conv2dBackwardWeight":  # (x, dy) -> per-example weight gradients
        x, dy = (_into_channels(bt, v, b) for v, b in zip(args, batched))
        dw = bt.emit(op, [x, dy], **grouped)
        return bt.emit("shapeCast", [dw], shape=(B, dw.type.shape[0] // B) + dw.type.shape[1:])
    image, w = args
    w = w if batched[1] else bt.full(w)
    w = bt.emit("shapeCast", [w], shape=(B * w.type.shape[1],) + w.type.shape[2:])
    out = bt.emit(op, [_into_channels(bt, image, batched[0]), w], **grouped)
    return _out_of_channels(bt, out)


def _batch_window(bt, op, args, batched, attrs):
    images = IMAGES.get(op)
    if op in GROUPED and (images is None or any(batched[1:])):
        return _batch_grouped(bt, op, args, batched, attrs)
    B = bt.size
    folded = []
    for i, (x, b) in enumerate(zip(args, batched)):
        if i in images:
            x = x if b else bt.full(x)
            x = bt.emit("shapeCast", [x], shape=(B * x.type.shape[1],) + x.type.shape[2:])
        folded.append(x)
    out = bt.emit(op, folded, **attrs)
    n = out.type.shape[0] // B
    return bt.emit("shapeCast", [out], shape=(B, n) + out.type.shape[1:])


def specs() -> list[OpSpec]:
    return [
        OpSpec(
            name,
            WINDOW,
            window_ops.ARITY[name],
            pascal(name),
            (lambda n: lambda ts, at: window_ops.result_type(n, ts, at))(name),
            (lambda n: lambda args, at: window_ops.evaluate(n, np, args, at))(name),
            attrs=window_ops.attr_names(name),
            float_only=True,
            nondiff_operands=window_ops.NONDIFF.get(name, ()),
            batch=_batch_window,
            symbolic=SYMBOLIC[name],
        )
        for name in window_ops.WINDOW_OPS
    ]
