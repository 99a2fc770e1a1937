"""Convolution and pooling (NCHW, torch's semantics): the rows of the window family, whose type
rules and array algorithms live in ir/window_ops.py (shared with codegen's im2col plan).

Under vmap a batch of images is a bigger batch of images: the batch axis folds into N.
"""

from __future__ import annotations

import numpy as np

from .. import window_ops
from ..op_spec import WINDOW, OpSpec, pascal

# operands that are images (N, C, H, W) whose N a vmap batch can fold into; the others (weights)
# must be unbatched. conv2dBackwardWeight sums over N: per-example weight gradients need a
# grouped product, not a fold, and have no rule yet.
IMAGES = {
    "conv2d": (0,),
    "conv2dBackwardInput": (0,),
    "maxPool2d": (0,),
    "maxPool2dBackward": (0, 1),
    "maxPool2dGather": (0, 1),
    "avgPool2d": (0,),
    "avgPool2dBackward": (0,),
}


def _batch_window(bt, op, args, batched, attrs):
    images = IMAGES.get(op)
    if images is None or any(b for i, b in enumerate(batched) if i not in images):
        raise bt.error(op, "a batched weight (or a per-example weight gradient)")
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
        )
        for name in window_ops.WINDOW_OPS
    ]
