"""Batching rules shared by op families (vmap, ir/batching.py). A rule is
`rule(bt, op, args, batched, attrs) -> Value`: operands with `batched[i]` carry the batch on
axis 0, unbatched ones are as the op saw them; the result carries the batch on axis 0. `bt`
(ir/batching.py's Batcher) emits IR: `bt.emit(op, args, **attrs)`, `bt.align(x, rank)` (a
batched x as (B, 1.., *shape) of rank + 1), `bt.full(x)` (an unbatched x broadcast to (B, ...)).

    elementwise(bt, "add", [x, w], (True, False), {})   # x (B, 3) + w (3,): broadcasting does it
"""

from __future__ import annotations


def _rank(a, batched: bool) -> int:
    return a.type.rank - int(batched)


def elementwise(bt, op, args, batched, attrs):
    """Broadcasting ops: a batched operand of lower rank gets size-1 axes after the batch axis,
    so that numpy's right-aligned broadcasting keeps the batch axis in front."""
    rank = max(_rank(a, b) for a, b in zip(args, batched))
    return bt.emit(op, [bt.align(a, rank) if b else a for a, b in zip(args, batched)], **attrs)


def shift_axis(*names: str, full: bool = True):
    """Ops with axis attributes (ints or tuples of ints) that count the operand's axes: each
    moves one up past the batch axis. Unbatched operands are broadcast to the batch (`full`:
    concatenate's parts), or left as they are (take's indices)."""

    def rule(bt, op, args, batched, attrs):
        moved = dict(attrs)
        for n in names:
            v = attrs.get(n)
            if v is not None:
                moved[n] = tuple(a + 1 for a in v) if isinstance(v, (tuple, list)) else v + 1
        xs = [a if b or not full else bt.full(a) for a, b in zip(args, batched)]
        return bt.emit(op, xs, **moved)

    return rule


def shape_attr(name: str):
    """Ops whose attribute is the result's shape (shapeCast, broadcast): the batch goes first."""

    def rule(bt, op, args, batched, attrs):
        (x,) = args
        shape = tuple(attrs[name])
        if op == "broadcast":  # right-aligned: the operand's own axes after the batch axis
            x = bt.align(x, len(shape))
        return bt.emit(op, [x], **{**attrs, name: (bt.size, *shape)})

    return rule
