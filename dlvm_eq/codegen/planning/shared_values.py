"""Where the planner splits a long fused expression, each value is still computed once (a mixin
of the planner, like kernel_groups.KernelGrouping).

A fused expression longer than KERNEL_EXPR_OPS scalar ops (ir/inline.py; fusion's cost model
splits there too) is written to a buffer. The values inlined into it that later instructions
also read would otherwise be recomputed, from the last buffers, in every later kernel: the
tanh-30 gradient's forward chain ran in each of its 4 kernels (70 tanh for 30). At a split,
such a value is written too when its recompute costs more than its write and read by the cost
model's prior (flops per element against bytes at the shipped CPU's balance), and an expression
met again inside a later kernel's expression is loaded from that buffer, not recomputed:

    ops_within(expr, 320)    # distinct scalar ops of expr, counting stops past 320
    ops_counted(expr, 320, memo)   # the same, from the op sets of expressions counted before
"""

from __future__ import annotations

import numpy as np

from ...ir.inline import KERNEL_EXPR_OPS
from ...ir.op_spec import COST_FLOPS
from ...ir.ops import OPS
from ..kernels.kernel_spec import c_strides
from ..kernels.spec import DTYPES, Binary, Cast, Const, Expr, Load, Select, Unary, children
from .kernel_groups import VIEW_OPS
from .values import EwOut, Fused

# kernel op name ('tanh', 'mul') -> flops per element before calibration (extract/target_cost.py
# prices the same cost classes)
KERNEL_FLOPS = {(s.kernel or n): COST_FLOPS[s.cost] for n, s in OPS.items() if s.cost in COST_FLOPS}
# The shipped CPU description's flop rate over its bandwidth (extract/machine.py: 100 GFLOP/s,
# 40 GB/s): a byte written and read again costs about this many flops of recompute.
FLOPS_PER_BYTE = 2.5


def ops_within(expr: Expr, limit: int) -> int:
    """Distinct scalar ops (not loads or constants) of `expr`'s DAG; stops counting past `limit`
    (O(limit), however deep the expression)."""
    seen, stack, n = set(), [expr], 0
    while stack and n <= limit:
        e = stack.pop()
        if e in seen or isinstance(e, (Load, Const)):
            continue
        seen.add(e)
        n += 1
        stack.extend(children(e))
    return n


# op sets (ops_counted) of this many recently counted expressions are kept: a chain's next
# value reads the last few, whose sets then count for all of their DAG at C speed
OP_SETS_KEPT = 64
_NOT_COUNTED = object()


def ops_counted(expr: Expr, limit: int, memo: dict) -> int:
    """ops_within(expr, limit) (exactly where at most `limit`, else more than `limit`), from
    the op sets in `memo` (expression -> frozenset of its ops, or None: more than limit) of
    expressions counted before: the walk stops at them. Records expr's set in `memo`, which
    keeps the last OP_SETS_KEPT (a tanh chain's split checks walked 320 ops per value)."""
    found: set = set()
    over = False  # more than limit ops: the walk stopped
    seen, stack = set(), [expr]
    while stack:
        e = stack.pop()
        if e in seen or isinstance(e, (Load, Const)):
            continue
        seen.add(e)
        below = memo.get(e, _NOT_COUNTED)
        if below is None:
            over = True
            break
        if below is _NOT_COUNTED:
            found.add(e)
            stack.extend(children(e))
        else:
            found |= below
        if len(found) > limit:
            over = True
            break
    memo[expr] = None if over else frozenset(found)
    if len(memo) > OP_SETS_KEPT:
        del memo[next(iter(memo))]  # the oldest: dicts keep insertion order
    return limit + 1 if over else len(found)


def expr_flops(expr: Expr, limit: float, written=()) -> float:
    """Flops per element of `expr`'s DAG (each op once) above the nodes in `written` (loaded,
    not computed), counting stops past `limit`."""
    seen, stack, f = set(), [expr], 0.0
    while stack and f <= limit:
        e = stack.pop()
        if e in seen or isinstance(e, (Load, Const)):
            continue
        seen.add(e)
        if e is not expr and e in written:
            continue
        if isinstance(e, (Unary, Binary)):
            f += KERNEL_FLOPS.get(e.op, 1)
        elif isinstance(e, (Select, Cast)):
            f += 1
        stack.extend(children(e))
    return f


def _rebuilt(e: Expr, kids: list[Expr]) -> Expr:
    if isinstance(e, Unary):
        return Unary(e.op, kids[0])
    if isinstance(e, Binary):
        return Binary(e.op, kids[0], kids[1])
    if isinstance(e, Select):
        return Select(kids[0], kids[1], kids[2])
    assert isinstance(e, Cast)
    return Cast(kids[0], e.dtype)


class SharedValues:
    """Splits of the planner's long expressions: needs its `refs`, `readers`, `pos_of`, `op_of`,
    `leaf` and `materialize`, `value_named` (IR value name -> Value, filled as instructions are
    planned) and `written_exprs` (shape -> expression -> the slot a kernel writes it to)."""

    def too_long(self, ref) -> bool:
        """A fused value past the kernel size fusion's cost model assumes (its tree count
        bounds its DAG's: the count runs only where that bound is passed)."""
        if ref.nodes <= KERNEL_EXPR_OPS:
            return False
        memo = self.__dict__.setdefault("_op_sets", {})
        return ops_counted(ref.expr, KERNEL_EXPR_OPS, memo) > KERNEL_EXPR_OPS

    def keep_shared(self, ref: Fused, name: str) -> None:
        """Before `ref` (value `name`) is written because it is too long: write the values
        inlined into it that more than one instruction (or a result) reads, in program order,
        where recomputing one from what is written already costs more than a write and a read.
        Then every value is computed once: one read once is computed by its reader."""
        for inner in sorted(ref.names - {name}, key=lambda n: self.pos_of.get(n, -1)):
            value = self.value_named.get(inner)
            if value is None or self.op_of.get(inner) in VIEW_OPS:
                continue
            r = self.refs.get(id(value))
            if not isinstance(r, Fused):
                continue
            if len({id(rd) for rd in self.readers.get(id(value), ())}) < 2:
                continue
            store = 2 * np.dtype(DTYPES[r.dtype]).itemsize * FLOPS_PER_BYTE  # write, read
            if expr_flops(r.expr, store, self.written_exprs.get(tuple(r.shape), {})) > store:
                self.refs[id(value)] = self.materialize(r, inner, self.pos_of[inner])

    def loaded_if_written(self, expr: Expr, shape: tuple) -> Expr:
        """`expr` with every sub-expression that a written value of the same shape computes
        read from that value's buffer (none of them depends on `expr`'s own value). One pass
        over the part of the DAG above those loads."""
        written = self.written_exprs.get(tuple(shape))
        if not written:
            return expr
        new: dict = {}
        stack = [(expr, False)]
        while stack:
            e, ready = stack.pop()
            if e in new:
                continue
            if isinstance(e, (Load, Const)):
                new[e] = e
            elif e is not expr and e in written:
                new[e] = self.leaf(written[e], c_strides(tuple(shape)))
            elif ready:
                kids = [new[c] for c in children(e)]
                same = all(k is c for k, c in zip(kids, children(e)))
                new[e] = e if same else _rebuilt(e, kids)
            else:
                stack.append((e, True))
                stack.extend((c, False) for c in children(e) if c not in new)
        return new[expr]

    def note_written(self, expr: Expr, out: EwOut) -> None:
        """`out` computes `expr` (as inlined in its readers, before loaded_if_written)."""
        if not isinstance(expr, (Load, Const)):
            self.written_exprs.setdefault(tuple(out.shape), {}).setdefault(expr, out.slot)
