"""vmap rules of the control-flow ops (ir/batching.py), as JAX's batching of scan_p, while_p
and cond_p. A rule returns one Value per element of the op's result, each batched on axis 0.

- scan: every carry batched (a carry the body makes batched must enter batched: unbatched
  ones are broadcast); a batched xs (B, T, ...) is read as (T, B, ...) so that each step is
  (B, ...); the body batched as its operands are; the stacked ys (T, B, ...) go back to
  (B, T, ...).
- cond/switch on an unbatched selector: the same op over the batched branches. On a batched
  selector every branch runs on the whole batch and `select` picks each example's result
  (switch: the index clamped, as JAX's).
- while: the loop runs while some example's condition holds; an example whose condition is
  false keeps its carries (`select`), so each example stops where it would alone.

    %r = scan @step carry (%h: <8 x 4 x f32>) over (%xs.t: <5 x 8 x 3 x f32>) length 5
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..control_flow import COND, SCAN, elements
from ..types import I32, TensorType

if TYPE_CHECKING:
    from ..module import Operand

# ir/module.py imports the registry: its names are imported where the rules run


def _results(bt, r) -> list:
    n = len(elements(r.type))
    if n == 1 and isinstance(r.type, TensorType):
        return [r]
    return [bt.emit("extract", [r], index=k) for k in range(n)]


def _swap01(bt, x):
    """x with its first two axes swapped (batch <-> steps)."""
    perm = (1, 0, *range(2, x.type.rank))
    return bt.emit("transpose", [x], perm=perm)


def scan_rule(bt, op, args, batched, attrs):
    nc, nx = attrs["carries"], attrs["xs"]
    carries = [a if b else bt.full(a) for a, b in zip(args[:nc], batched[:nc])]
    xs = [_swap01(bt, a) if b else a for a, b in zip(args[nc : nc + nx], batched[nc : nc + nx])]
    withs = list(args[nc + nx :])
    flags = [True] * nc + list(batched[nc:])
    body = bt.batch_body(attrs["body"], flags)
    r = bt.emit(SCAN, [*carries, *xs, *withs], **dict(attrs, body=body))
    outs = _results(bt, r)
    return outs[:nc] + [_swap01(bt, y) for y in outs[nc:]]


def _mask(bt, m, like):
    """A batched (B,) bool mask broadcast to `like`'s batched shape."""
    shape = like.type.shape
    aligned = bt.align(m, len(shape) - 1)
    return bt.emit("broadcast", [aligned], shape=shape) if aligned.type.shape != shape else aligned


def branch_rule(bt, op, args, batched, attrs):
    from ..loop_rules import inline
    from ..module import Const

    selector, operands, flags = args[0], list(args[1:]), list(batched[1:])
    branches = [bt.batch_body(f, flags) for f in attrs["branches"]]
    if not batched[0]:
        return _results(bt, bt.emit(op, [selector, *operands], branches=tuple(branches)))
    outs = [_materialized(bt, inline(bt.builder, f, operands, bt.location)) for f in branches]
    if op == COND:  # branch 0 where the predicate holds
        return [bt.emit("select", [a, b, _mask(bt, selector, a)]) for a, b in zip(outs[0], outs[1])]
    picked = outs[0]
    for k, out in enumerate(outs[1:], start=1):  # index >= k: branch k or a later one
        at_least = bt.emit("greaterThanOrEqual", [selector, Const.of(k, I32)])
        picked = [bt.emit("select", [o, p, _mask(bt, at_least, o)]) for o, p in zip(out, picked)]
    return picked


def _materialized(bt, outs: list) -> list:
    """Inlined outputs as Values (a branch may return a constant)."""
    from ..module import Value

    return [
        o if isinstance(o, Value) else bt.emit("literal", [], value=o.value, type=o.type)
        for o in outs
    ]


def while_rule(bt, op, args, batched, attrs):
    nc = attrs["carries"]
    carries = [a if b else bt.full(a) for a, b in zip(args[:nc], batched[:nc])]
    flags = [True] * nc + list(batched[nc:])
    test = bt.batch_body(attrs["cond"], flags)
    step = bt.batch_body(attrs["body"], flags)
    ops = [*carries, *args[nc:]]
    types = [o.type for o in ops]
    names = [p.name for p in attrs["body"].params]
    r = bt.emit(
        op,
        ops,
        cond=_any_test(test, types, names),
        body=_masked_step(test, step, types, names, nc, bt.size),
        carries=nc,
    )
    return _results(bt, r)


def _any_test(test, types, names):
    """Whether the batched condition holds for any example."""
    from ..loop_rules import inline
    from ..module import Const, FunctionBuilder

    b = FunctionBuilder(f"{test.name}.any", types, names)
    (holds,) = inline(b, test, list(b.params))
    as_int = b.emit("dataTypeCast", [holds], dtype=I32)
    top = b.emit("reduce", [as_int], combinator="max", init=0, axes=(0,))
    return b.finish(b.emit("greaterThan", [top, Const.of(0, I32)]))


def _masked_step(test, step, types, names, nc: int, size: int):
    """The batched step, applied only to the examples whose condition holds."""
    from ..batching import Batcher
    from ..loop_rules import inline
    from ..module import FunctionBuilder

    b = FunctionBuilder(f"{step.name}.masked", types, names)
    bt = Batcher(b, size)
    (holds,) = inline(b, test, list(b.params))
    new = _materialized(bt, inline(b, step, list(b.params)))
    out: list[Operand] = [
        b.emit("select", [n, c, _mask(bt, holds, n)]) for n, c in zip(new, b.params[:nc])
    ]
    return b.finish(out[0] if len(out) == 1 else out)


__all__ = ["branch_rule", "scan_rule", "while_rule"]
