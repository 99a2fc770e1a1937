"""Values verify-rules tries for the packed attribute vector of a convolution or pooling
constructor (rules/schema.egg: `(Conv2d x w c)`, c = window_ops.pack(...)): strides, paddings,
dilations, groups and kernels small enough for the rank-4 shapes with dims 1 and 2 that the
search tries; a backward op's size entries range over those dims too. Attribute vectors that
do not fit the drawn operands fail the type check and are dropped by the search.

    window_attr_domain("Conv2d")     # [(1, 1, 0, 0, 0, 0, 1, 1, 1), ...]
"""

from __future__ import annotations

import itertools
from functools import cache

from ..ir import window_ops
from ..ir.ops import OPS

HEADS = {OPS[op].egg: op for op in window_ops.WINDOW_OPS}
_SIZES = [(1, 1), (1, 2), (2, 1), (2, 2)]
_CONV = {
    "stride": [(1, 1), (2, 1)],
    "padding": [(0, 0, 0, 0), (1, 0, 0, 1)],
    "dilation": [(1, 1), (1, 2)],
    "groups": [1, 2],
    "size": _SIZES,
}
# the last try for rules no small window satisfies (rules/layout.egg's depthwise 3x3 and
# conv1d forms): "same" 3x3 and 1x3 windows, searched over rank-4 shapes of dims 1 and 3
# (`Space.for_windows`)
_CONV_3X3 = {
    "stride": [(1, 1)],
    "padding": [(1, 1, 1, 1), (0, 0, 1, 1)],
    "dilation": [(1, 1)],
    "groups": [1, 3],
    "size": [(3, 3), (1, 3)],
}
_POOL = {
    "kernel": [(1, 1), (2, 2), (2, 1)],
    "stride": [(1, 1), (2, 2)],
    "padding": [(0, 0, 0, 0), (1, 0, 0, 0)],
    "size": _SIZES,
}


@cache
def window_attr_domain(head: str, windows: str = "small") -> list[tuple[int, ...]]:
    """windows: "small" (kernels of 1 and 2) or "3x3" (same-padded 3x3 convolutions)."""
    op = HEADS[head]
    conv = _CONV_3X3 if windows == "3x3" else _CONV
    choices = conv if op in window_ops.CONV_OPS else _POOL
    names = window_ops.attr_names(op)
    return [
        window_ops.pack(op, dict(zip(names, values)))
        for values in itertools.product(*(choices[n] for n in names))
    ]
