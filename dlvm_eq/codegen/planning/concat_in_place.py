"""Concatenations written in place (CPU plans, issue 33): where every part of a concatenation
is a temporary that one step of the plan writes and only the concatenation reads, each
producer writes straight into its slice of the concatenation's buffer and the copy is gone.

- A product (plan.BlasStep, its own layout or already written in its reader's:
  product_layout.py) writes through strides (`out_view`) into an alias of the buffer that
  starts at its slice: BLAS takes a column block through its leading dimension.
- A map or row kernel writes its outputs in C order, so it takes a part only where the part
  is one contiguous block of the buffer (nothing but 1s before the concatenated axis).
- Anything else (a parameter, a constant, a view, a part also read elsewhere, a reduction, a
  numpy step): the concatenation stays a copy, all of it.

    nodes = write_concats_in_place(nodes, slots)    # planner.finish, after write_in_reader_layout

x^T [dQ|dK|dV] (rules/merge_adjoint.egg) pays only so: the copy of the three adjoints cost
more than the two products it saves (9.71 ms three products, 10.57 copy and one product).
extract/target_cost.py prices a concatenation that qualifies as free.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from ..kernels.kernel_spec import KernelSpec, c_strides
from .plan import ALIAS, TEMP, AliasStep, BlasStep, ConcatStep, KernelStep, RowStep, View
from .steps_order import Node, producers_and_readers
from .views import is_contiguous

if TYPE_CHECKING:  # the planner's values load only when a plan is built: a warm call reads
    from .values import SlotInfo  # this module's switch for the plan key (epilogue.plan_settings)

ENABLED = True  # tests and benchmarks turn it off to compare with the copy


def write_concats_in_place(nodes: list[Node], slots: list[SlotInfo]) -> list[Node]:
    """`nodes` with every concatenation whose parts can all be written in place removed, its
    parts' producers writing into aliases of its buffer. `slots` grows by one alias a part."""
    if not ENABLED:
        return nodes
    from .values import SlotInfo

    producer, reads = producers_and_readers(nodes)
    replaced: dict[int, Node] = {}  # id(producer node) -> its node writing in place
    dropped: set[int] = set()  # ids of the concatenations now written by their producers
    added: list[Node] = []  # the alias steps
    done: dict[int, list[int]] = {}  # concatenation's slot -> the aliases its readers wait on
    token = -1  # node-only slots ordering an alias before its writer (never a plan slot)
    for node in nodes:
        step = node.payload
        if not isinstance(step, ConcatStep) or slots[step.out].role != TEMP:
            continue
        moves = _moves(step, slots, producer, reads, replaced)
        if moves is None:
            continue
        aliases = []
        for writer, part, base, write in moves:
            cur = replaced.get(id(writer), writer)
            alias = len(slots)
            size = math.prod(slots[step.out].shape) - base
            slots.append(SlotInfo((size,), slots[part].dtype, ALIAS, slots[part].name))
            added.append(
                Node(
                    set(),
                    [token],
                    cur.order,
                    AliasStep(step.out, alias, base, step.value, cur.order),
                )
            )
            new_step = _written_at(cur.payload, part, alias, write)
            outputs = [alias if o == part else o for o in cur.outputs]
            replaced[id(writer)] = Node(cur.inputs | {token}, outputs, cur.order, new_step)
            replaced[id(writer)].source = cur.source
            aliases.append(alias)
            token -= 1
        done[step.out] = aliases
        dropped.add(id(node))
    if not done:
        return nodes
    out = []
    for n in nodes:
        if id(n) in dropped:  # the concatenation: its producers wrote it
            continue
        new = replaced.get(id(n), n)
        for s in list(new.inputs):  # a reader of the buffer waits for every part's writer
            new.inputs |= set(done.get(s, ()))
        out.append(new)
    return added + out


def _moves(step: ConcatStep, slots, producer, reads, replaced) -> list | None:
    """[(producer node, part slot, element offset in the buffer, write)] for every part, or
    None where one part cannot be written in place. write: the product's element strides into
    the alias (over its result shape), or None for a kernel's C-ordered output."""
    shape, k = slots[step.out].shape, step.axis
    cs = c_strides(shape)
    row = shape[k] * cs[k]  # elements between two rows of the buffer (dims before k)
    parts = [p.slot for p in step.parts]
    moves, at = [], 0
    for view in step.parts:
        p = view.slot
        base, width = at * cs[k], view.shape[k]
        at += width
        info = slots[p]
        if (
            info.role != TEMP
            or info.dtype != slots[step.out].dtype
            or parts.count(p) != 1
            or reads.get(p) != 1
            or any(op != "reshape" for op, _ in view.chain)
            or not is_contiguous(view.shape, view.strides)
            or math.prod(view.shape) != math.prod(info.shape)
            or p not in producer
            or math.prod(view.shape) == 0
        ):
            return None
        writer = producer[p]
        payload = replaced.get(id(writer), writer).payload
        inner = width * cs[k]  # a part's elements in one row of the buffer
        if isinstance(payload, BlasStep):
            if payload.out != p:
                return None
            if payload.out_view is not None:
                shape_w, strides_w = payload.out_view.shape, payload.out_view.strides
            else:
                shape_w, strides_w = info.shape, c_strides(info.shape)
            write = _rows_apart(shape_w, strides_w, inner, row)
            if write is None:
                return None
            moves.append((writer, p, base, View(-1, tuple(shape_w), write)))
        elif _kernel_output(payload, p):
            if math.prod(view.shape[:k]) != 1:  # C order: only one block of the buffer
                return None
            moves.append((writer, p, base, None))
        else:
            return None
    return moves


def _kernel_output(step, p: int) -> bool:
    """Whether `p` is a C-ordered output of a map or row kernel (written through its pointer)."""
    if isinstance(step, KernelStep):
        return isinstance(step.spec, KernelSpec) and p in step.outputs
    return isinstance(step, RowStep) and p in step.outputs


def _rows_apart(shape, strides, inner: int, row: int) -> tuple | None:
    """The strides over `shape` that write, into the buffer, the elements a product writes at
    `strides` into its own C-ordered part, the part's rows of `inner` elements now `row`
    apart: a dim moving whole part rows moves buffer rows, the others stay within one row.
    None where a dim does neither (its moves would straddle a row)."""
    out, reach = [], 0
    for d, s in zip(shape, strides):
        if d == 1:
            out.append(0)
        elif s > 0 and s % inner == 0:
            out.append(s // inner * row)
        elif s > 0:
            out.append(s)
            reach += s * (d - 1)
        else:
            return None
    return tuple(out) if reach < inner else None


def _written_at(step, part: int, alias: int, write: View | None):
    """The producer step writing `part` into `alias` instead."""
    if isinstance(step, BlasStep):
        assert write is not None
        return dataclasses.replace(
            step, out=alias, out_view=View(alias, write.shape, write.strides)
        )
    outputs = tuple(alias if o == part else o for o in step.outputs)
    return dataclasses.replace(step, outputs=outputs)


__all__ = ["ENABLED", "write_concats_in_place"]
