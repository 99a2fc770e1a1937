"""A scan's body plan as a list of native calls (data only: no kernel is compiled here), for
the loop driver (runtime/loop_driver.py) that runs every step of the scan without Python.

    lp = loop_plan(plan, carries=1, xs=1)     # a LoopPlan, or a str saying why not
    lp.records                                # [Record(kind, fn, args)], one step of the scan

A record's `fn` is ("kernel", step index) for a compiled kernel (its address, leading integers
and dims array are the executor's, filled in when the loop runs) or ("blas", dtype) for a
GEMM; a COPY record has no function (the driver copies). Arguments are integers or
`Ptr(slot, byte offset)`: where a slot's memory is (the arena, an argument, a per-step slice of
xs or ys) is decided when the loop runs.

Per step, after the body's steps: each y is copied into its row of the stacked ys (or the
body writes it there directly, `direct_ys`), and each carry result is copied into the carry
parameter that the next step reads, unless the carry is `swapped`: where the result is an
output buffer of its own, the carry parameter and the result trade buffers every step instead
(ping-pong: the driver points them at buffer A and B, then B and A), and nothing is copied.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..kernels.spec import DTYPES
from ..runtime.loop_driver import BREAK, CALL, COPY, DGEMM, MAX_ARGS, SGEMM
from .plan import (
    OUTPUT,
    PARAM,
    AliasStep,
    BlasStep,
    ConcatStep,
    CopyStep,
    GemmStep,
    KernelStep,
    MapReduceStep,
    Plan,
    RowStep,
    arena_aliases,
)

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's constants
MAX_VIEW_ELEMENTS = 1 << 22  # views are resolved on an index array of the slot's size


@dataclass(frozen=True)
class Ptr:
    slot: int
    offset: int = 0  # bytes


@dataclass
class Record:
    kind: int
    fn: tuple | None
    args: list


@dataclass
class LoopPlan:
    records: list
    carries: int
    xs: int
    direct_ys: dict = field(default_factory=dict)  # output slot -> y index (written in place)
    swapped: dict = field(default_factory=dict)  # carry index -> its result slot (ping-pong)


def _view(plan: Plan, view) -> tuple[int, tuple, tuple] | None:
    """(element offset, shape, element strides) of a View on its slot, None if unknown."""
    slot = plan.slots[view.slot]
    size = int(np.prod(slot.shape, dtype=np.int64))
    if size > MAX_VIEW_ELEMENTS:
        return None
    if not view.chain:
        shape = tuple(slot.shape)
        strides = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape)))
        return 0, shape, strides
    from .views import apply_chain

    idx = np.arange(max(size, 1), dtype=np.int64)[:size].reshape(slot.shape)
    v = apply_chain(idx, view.chain, np)
    if v.size == 0:
        return None
    offset = int(v.reshape(-1)[0]) if v.ndim else int(v)
    return offset, tuple(v.shape), tuple(s // 8 for s in v.strides)


def _rows_cols(shape, strides):
    """(rows, cols, row stride, col stride) in elements covering the view, None if not 2-D."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    merged: list = []
    for n, s in dims:
        if merged and merged[-1][1] == s * n:
            merged[-1] = (merged[-1][0] * n, s)
        else:
            merged.append((n, s))
    if len(merged) > 2:
        return None
    while len(merged) < 2:
        merged.insert(0, (1, 0))
    (r, rs), (c, cs) = merged
    return r, c, rs, cs


def _gemm_operand(plan: Plan, view):
    """(Ptr, transpose flag, leading dimension) of a 2-D GEMM operand, None if BLAS cannot
    read it in place."""
    got = _view(plan, view)
    if got is None or len(got[1]) != 2:
        return None
    offset, (r, c), (s0, s1) = got
    es = DTYPES[plan.slots[view.slot].dtype].itemsize
    if s1 == 1 or c == 1:
        if s0 < c and r > 1:
            return None
        return Ptr(view.slot, offset * es), NO_TRANS, max(s0, c, 1)
    if s0 == 1 or r == 1:
        if s1 < r and c > 1:
            return None
        return Ptr(view.slot, offset * es), TRANS, max(s1, r, 1)
    return None


def _copy(plan: Plan, dst: Ptr, src_view, es: int):
    got = _view(plan, src_view)
    if got is None:
        return None
    offset, shape, strides = got
    rc = _rows_cols(shape, strides)
    if rc is None or 0 in shape:
        return None
    r, c, rs, cs = rc
    return Record(COPY, None, [dst, Ptr(src_view.slot, offset * es), r, c, rs * es, cs * es, es])


def _concat(plan: Plan, step: ConcatStep) -> list | None:
    """A COPY record per part into its rows of the output (dst's row stride in arg 7), None
    where a part is not a 2-D block whose output rows have adjacent elements."""
    out = plan.slots[step.out]
    es = DTYPES[out.dtype].itemsize
    shape = tuple(out.shape)
    ostrides = [int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape))]
    records, start = [], 0
    for part in step.parts:
        dst = start * ostrides[step.axis]
        start += part.shape[step.axis]
        if 0 in part.shape:
            continue
        got = _view(plan, part)
        if got is None or len(got[1]) != len(shape):
            return None
        offset, pshape, pstrides = got
        merged: list = []  # (extent, src stride, dst stride), adjacent axes merged where both allow
        for n, s, d in zip(pshape, pstrides, ostrides):
            if n == 1:
                continue
            if merged and merged[-1][1] == s * n and merged[-1][2] == d * n:
                merged[-1] = (merged[-1][0] * n, s, d)
            else:
                merged.append((n, s, d))
        if len(merged) > 2:
            return None
        while len(merged) < 2:
            merged.insert(0, (1, 0, 0))
        (r, rs, rd), (c, cs, cd) = merged
        if cd != 1:
            return None
        src = Ptr(part.slot, offset * es)
        records.append(
            Record(COPY, None, [Ptr(step.out, dst * es), src, r, c, rs * es, cs * es, es, rd * es])
        )
    return records


def _blas(plan: Plan, step: BlasStep):
    out = plan.slots[step.out]
    if step.out_view is not None:  # written in its reader's layout: not a plain BLAS call
        return None
    if out.dtype not in ("f32", "f64") or len(out.shape) != 2 or 0 in out.shape:
        return None
    if len(step.a.shape) != 2 or len(step.b.shape) != 2:
        return None
    a, b = _gemm_operand(plan, step.a), _gemm_operand(plan, step.b)
    if a is None or b is None:
        return None
    m, n = out.shape
    k = step.a.shape[1]
    if k == 0:
        return None
    kind = SGEMM if out.dtype == "f32" else DGEMM
    return Record(
        kind,
        ("blas", out.dtype),
        [ROW_MAJOR, a[1], b[1], m, n, k, a[0], a[2], b[0], b[2], Ptr(step.out), n],
    )


def loop_plan(plan: Plan, carries: int, xs: int, swap: bool = True) -> LoopPlan | str:
    """The body `plan` of a scan with `carries` carries and `xs` per-step inputs as native
    records, or why it cannot run natively (the Python driver runs it then). `swap`: carries
    whose result has a buffer of its own trade buffers instead of being copied."""
    if any(s.dtype not in DTYPES for s in plan.slots):
        return "a slot of another dtype"
    aliases = {}  # slot -> Ptr of its source (aliases are flat views from an offset)
    fixed = arena_aliases(plan)
    records: list = []
    alias_outs = set()
    for i, step in enumerate(plan.steps):
        if isinstance(step, AliasStep):
            alias_outs.add(step.out)
            es = DTYPES[plan.slots[step.src].dtype].itemsize
            src = aliases.get(step.src, Ptr(step.src))
            aliases[step.out] = Ptr(src.slot, src.offset + step.offset * es)
            if i in fixed:  # made with the arena: its pointer is the arena's
                aliases.pop(step.out)
            continue
        if isinstance(step, (KernelStep, RowStep, MapReduceStep)):
            slots = list(step.outputs) + list(getattr(step, "reductions", ())) + list(step.inputs)
            if len(slots) + 5 > MAX_ARGS:
                return "a kernel with too many arguments"
            records.append(Record(CALL, ("kernel", i), [Ptr(s) for s in slots]))
        elif isinstance(step, GemmStep):  # the product, then its epilogue as a kernel
            r = _blas(plan, step.blas)
            e = step.epilogue
            if r is None:
                return "a product BLAS cannot run in place"
            records.append(r)
            slots = list(e.outputs) + list(e.inputs)
            records.append(Record(CALL, ("epilogue", i), [Ptr(s) for s in slots]))
        elif isinstance(step, BlasStep):
            r = _blas(plan, step)
            if r is None:
                return "a product BLAS cannot run in place"
            records.append(r)
        elif isinstance(step, ConcatStep):
            got = _concat(plan, step)
            if got is None:
                return "a concatenation of parts that are not 2-D blocks"
            records.extend(got)
        elif isinstance(step, CopyStep):
            es = DTYPES[plan.slots[step.out].dtype].itemsize
            r = _copy(plan, Ptr(step.out), step.src, es)
            if r is None:
                return "a copy of a view with more than two axes"
            records.append(r)
        else:
            return f"a {type(step).__name__}"
    records = [_resolve(r, aliases) for r in records]
    results = plan.results
    if any(r.chain for r in results) or len(results) < carries:
        return "a result that is a view"
    # ys: written in place where the body's output slot is theirs alone
    uses: dict = {}
    for r in results:
        uses[r.slot] = uses.get(r.slot, 0) + 1
    direct: dict = {}
    tail: list = []
    for j, r in enumerate(results[carries:]):
        s = plan.slots[r.slot]
        es = DTYPES[s.dtype].itemsize
        if s.role == OUTPUT and uses[r.slot] == 1 and r.slot not in aliases:
            direct[r.slot] = j
        else:
            size = int(np.prod(s.shape, dtype=np.int64))
            if size == 0:
                continue
            src = aliases.get(r.slot, Ptr(r.slot))
            tail.append(Record(COPY, None, [("y", j), src, 1, size, 0, es, es]))
    # carries: each result into the parameter the next step reads
    carry_params = plan.params[:carries]
    swapped: dict = {}
    for c, r in enumerate(results[:carries]):
        s = plan.slots[r.slot]
        if r.slot == carry_params[c]:
            continue
        if r.slot in carry_params:
            return "carries that swap places"
        size = int(np.prod(s.shape, dtype=np.int64))
        if size == 0:
            continue
        own = s.role == OUTPUT and uses[r.slot] == 1 and r.slot not in alias_outs
        if swap and own and r.slot not in direct:
            swapped[c] = r.slot
            continue
        src = aliases.get(r.slot, Ptr(r.slot))
        es = DTYPES[s.dtype].itemsize
        tail.append(Record(COPY, None, [Ptr(carry_params[c]), src, 1, size, 0, es, es]))
    if any(plan.slots[s].role != PARAM for s in plan.params):
        return "a parameter slot of another role"
    return LoopPlan(records + tail, carries, xs, direct, swapped)


def _resolve(record: Record, aliases: dict) -> Record:
    args = []
    for a in record.args:
        if isinstance(a, Ptr) and a.slot in aliases:
            base = aliases[a.slot]
            a = Ptr(base.slot, base.offset + a.offset)
        args.append(a)
    return Record(record.kind, record.fn, args)


__all__ = [
    "BREAK",
    "CALL",
    "COPY",
    "DGEMM",
    "MAX_ARGS",
    "SGEMM",
    "LoopPlan",
    "Ptr",
    "Record",
    "loop_plan",
]
