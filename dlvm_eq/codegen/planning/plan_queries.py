"""What the planner (planner.py) asks of an instruction or a value: who reads it, what kind of
plan step it becomes, the strided view a layout op gives, a kernel's symbol-safe name.

    users = readers(flat)          # id(value) -> the instructions reading it
    value_kind(inst)               # "ew", "view", "reduce", "dot", "concat", ...
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ...ir.inline import Flat
from ...ir.module import Instruction, Value
from ...ir.ops import (
    BINARY,
    CAST,
    COMPARE,
    DOT,
    LITERAL,
    LOGIC,
    OPS,
    REDUCE,
    SELECT,
    TUPLE,
    UNARY,
    WINDOW,
    transpose_perm,
)
from .kernel_groups import VIEW_OPS
from .plan import View
from .values import Mat
from .views import (
    broadcast_strides,
    pad_strides,
    reshape_strides,
    squeeze_strides,
    transpose_strides,
)

# the kinds that become scalar expressions inside a kernel
EW_KINDS = (UNARY, BINARY, COMPARE, LOGIC, SELECT, CAST)


def readers(flat: Flat) -> dict[int, list]:
    """id(value) -> the instructions reading it, once per operand (None: a function result)."""
    users: dict[int, list] = {}
    for inst in flat.body:
        for o in inst.operands:
            users.setdefault(id(o), []).append(inst)
    for r in flat.results:
        users.setdefault(id(r), []).append(None)
    return users


def spliced_concats(flat: Flat, users: dict[int, list]) -> set[int]:
    """ids of the concatenations read only by a concatenation along the same axis: their reader
    copies their parts itself (x@[[A|B]|C], the merged weights of three products, is one copy).
    `users`: readers(flat)."""
    out = set()
    for inst in flat.body:
        if inst.op != "concatenate":
            continue
        (user, *more) = users.get(id(inst.result), [None])
        if (
            not more
            and user is not None
            and user.op == "concatenate"
            and user.attrs["axis"] == inst.attrs["axis"]
        ):
            out.add(id(inst.result))
    return out


def value_kind(inst: Instruction) -> str:
    spec = OPS[inst.op]
    if spec.kind in EW_KINDS:
        return "ew"
    if inst.op in VIEW_OPS:
        return "view"
    if spec.kind == REDUCE:
        return "reduce"
    if spec.kind == DOT:
        return "dot"
    if inst.op == "concatenate":
        return "concat"
    if spec.kind == WINDOW:
        return "window"
    if spec.kind == LITERAL:
        return "const" if np.ndim(inst.attrs["value"]) == 0 else "literal"
    if spec.kind == TUPLE:
        return "tuple"
    return inst.op


def operand_name(o) -> str:
    return o.name if isinstance(o, Value) else "const"


def view_of(m: Mat) -> View:
    return View(m.slot, tuple(m.shape), tuple(m.strides), tuple(m.chain))


def layout_view_map(inst: Instruction, shape):
    """(strides -> strides or None, numpy chain link) for a layout op on a view of `shape`."""
    t = inst.result.type
    op, at = inst.op, inst.attrs
    if op == "transpose":
        perm = transpose_perm(len(shape), at)
        return (lambda st: transpose_strides(st, perm)), ("transpose", tuple(perm))
    if op == "broadcast":
        return (lambda st: broadcast_strides(st, shape, t.shape)), ("broadcast", tuple(t.shape))
    if op == "padShape":
        return (lambda st: pad_strides(st, at["at"])), ("reshape", tuple(t.shape))
    if op == "squeezeShape":
        return (lambda st: squeeze_strides(st, at["at"])), ("reshape", tuple(t.shape))
    return (lambda st: reshape_strides(shape, st, t.shape)), ("reshape", tuple(t.shape))


def renamed_kernel(spec, name: str):
    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in name)[:48]
    return dataclasses.replace(spec, name=safe)
