"""Variance and standard deviation, as numpy computes them (two passes: the mean, then the
mean squared deviation), with numpy's `ddof`:

    dq.var(x, axis=0)          # sum((x - mean)^2) / n
    dq.std(x, ddof=1)          # sqrt(sum((x - mean)^2) / (n - 1))
"""

from __future__ import annotations

import numpy as np

from ..ir.types import F32
from . import ops
from .context import shape_error
from .ops import normalize_axes, shape_of
from .primitive import promote


def var(x, axis=None, ddof=0, keepdims=False):
    """Variance over `axis` (None: all); divides by n - ddof."""
    if not promote([x]).is_float:
        x = ops.astype(x, F32)
    shape = shape_of(x)
    axes = normalize_axes(axis, shape, "var")
    count = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    if count - ddof <= 0:
        raise shape_error(
            f"var: ddof {ddof} leaves no degrees of freedom for {count} "
            f"element{'s' * (count != 1)} along axis {axis}"
        )
    deviation = ops.subtract(x, ops.mean(x, axes, keepdims=True))
    return ops.divide(ops.sum(ops.square(deviation), axes, keepdims), count - ddof)


def std(x, axis=None, ddof=0, keepdims=False):
    """Standard deviation over `axis`: sqrt(var(x, axis, ddof))."""
    return ops.sqrt(var(x, axis, ddof, keepdims))
