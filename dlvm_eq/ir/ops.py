"""The op table: the single source of truth for the op set, read by every later stage.

The ops themselves are declared in their families' modules (ir/registry/); this module is the
table's stable address: `OPS`, the kinds, and the helpers of op attributes.

    >>> OPS["add"].result_type([tensor(2, 3, F32), scalar(F32)], {})
    TensorType(shape=(2, 3), dtype=<DType.f32: 'f32'>)
"""

from __future__ import annotations

from ..errors import IRError
from .op_spec import (  # noqa: F401
    BINARY,
    CALL,
    CAST,
    COMPARE,
    CONTROL,
    DOT,
    ELEMENTWISE_KINDS,
    GATHER,
    LAYOUT,
    LITERAL,
    LOGIC,
    REDUCE,
    SCAN,
    SELECT,
    SLICE,
    TUPLE,
    UNARY,
    WINDOW,
    OpSpec,
)
from .registry import REGISTRY
from .registry.bits import BIT_OPS  # noqa: F401
from .registry.gather import checked_indices  # noqa: F401
from .registry.layout import scatter_slice, slice_index, transpose_perm  # noqa: F401
from .registry.reduction import REDUCE_COMBINATORS  # noqa: F401
from .types import F32, scalar, tensor  # noqa: F401

OPS: dict[str, OpSpec] = REGISTRY

UNARY_OPS = tuple(n for n, s in OPS.items() if s.kind == UNARY)
BINARY_OPS = tuple(n for n, s in OPS.items() if s.kind == BINARY)
COMPARE_OPS = tuple(n for n, s in OPS.items() if s.kind == COMPARE)
ELEMENTWISE_OPS = tuple(n for n, s in OPS.items() if s.kind in ELEMENTWISE_KINDS)


def lookup(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        raise IRError(f"unknown op {name!r}") from None
