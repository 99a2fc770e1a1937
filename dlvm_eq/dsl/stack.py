"""`stack`: arrays of one shape joined along a new axis, as numpy does; each gains a size-1
axis (`shapeCast`), then one `concatenate` joins them.

    dq.stack([a, b, c], axis=1)      # three (4, 5) arrays -> (4, 3, 5)
"""

from __future__ import annotations

from .context import shape_error
from .ops import concatenate, reshape, shape_of


def stack(arrays, axis=0):
    """Join arrays of equal shape along a new axis `axis` (negative from the end of the
    result's axes)."""
    arrays = list(arrays)
    if not arrays:
        raise shape_error("stack: needs at least one array")
    shape = tuple(shape_of(arrays[0]))
    for a in arrays[1:]:
        if tuple(shape_of(a)) != shape:
            raise shape_error(
                f"stack: all arrays must have one shape, got {shape} and {tuple(shape_of(a))}"
            )
    rank = len(shape) + 1
    if not isinstance(axis, int) or not -rank <= axis < rank:
        raise shape_error(f"stack: axis {axis} is out of range for {rank}-dimensional results")
    axis %= rank
    grown = shape[:axis] + (1,) + shape[axis:]
    return concatenate([reshape(a, grown) for a in arrays], axis=axis)
