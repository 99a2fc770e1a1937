"""What the planner knows about each IR value while it plans: held in a buffer (`Mat`),
computed in registers (`Fused`), a constant (`Konst`); kernel outputs (`EwOut`), reductions
(`ReduceNode`) and slots (`SlotInfo`). Plain data, private to planning.
"""

from __future__ import annotations

from ...records import dataclass
from ..kernels.spec import Expr


@dataclass(frozen=True)
class Mat:
    """A value held in a buffer (slot), seen through a view."""

    slot: int
    shape: tuple
    dtype: str
    strides: tuple
    chain: tuple = ()


@dataclass(frozen=True)
class Fused:
    """A value computed in registers: an expression over leaves (global Load ids)."""

    expr: Expr
    shape: tuple
    dtype: str
    names: frozenset
    nodes: int


@dataclass(frozen=True)
class Konst:
    """A constant value of the planned program: its scalar value, dtype and broadcast shape."""

    value: object
    dtype: str
    shape: tuple


@dataclass
class EwOut:
    """A materialized elementwise value: a kernel output."""

    name: str
    expr: Expr
    shape: tuple
    dtype: str
    slot: int
    order: int
    names: frozenset
    group: int = -1
    reads: set = None  # slots its expression loads (grouping)


@dataclass
class ReduceNode:
    """A reduction being planned: its body over leaves, op, axes and init, and the slot it fills."""

    name: str
    body: Expr
    shape: tuple
    op: str
    axes: tuple
    init: object
    slot: int
    order: int
    names: frozenset


@dataclass
class SlotInfo:
    """A slot while it is planned: shape, dtype, role and the IR value it holds."""

    shape: tuple
    dtype: str
    role: str
    name: str = ""
