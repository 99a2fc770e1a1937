"""`clip` as a composition, `minimum(maximum(x, lo), hi)`, while the op table has no `clip`
primitive; where one lands, this file is what to drop (its adjoint rules then replace the
ones of `max` and `min` this form differentiates through).

    dq.clip(x, -1.0, 1.0)        # numpy's clip: lo first, then hi (so hi wins if lo > hi)
"""
from __future__ import annotations

from .context import shape_error
from .ops import maximum, minimum


def clip(x, lo=None, hi=None):
    """Elementwise `min(max(x, lo), hi)`; either bound may be None (unbounded)."""
    if lo is None and hi is None:
        raise shape_error("clip: give at least one of lo and hi")
    if lo is not None:
        x = maximum(x, lo)
    return x if hi is None else minimum(x, hi)
