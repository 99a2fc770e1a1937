"""Loop skeletons in llvmlite: a counted loop, and a loop over a flat index range of a strided
sub-space (decompose the start once, then run the innermost dim as a tight loop that LLVM
vectorizes, carrying into the outer dims between rows).

    >>> strided_range(b, lo, hi, dims, strides, bases, body)   # body(b, offsets, flat_index)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from .emitter import I64

Body = Callable[[ir.IRBuilder, list, ir.Value], None]


def i64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def _c(like: ir.Value, v: int) -> ir.Constant:
    return ir.Constant(like.type, v)


def counted_loop(
    b: ir.IRBuilder,
    start,
    end,
    body: Callable[[ir.IRBuilder, ir.Value], None],
    name: str = "loop",
    step=None,
):
    """for (i = start; i < end; i += step) body(i) (step 1 by default); leaves the builder after
    the loop. The index has the type of `start` (i64 on CPU; i32 or i64 on GPU)."""
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    blk = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.end")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(start.type, name=f"{name}.i")
    i.add_incoming(start, pre)
    b.cbranch(b.icmp_signed("<", i, end), blk, done)
    b.position_at_end(blk)
    body(b, i)
    nxt = b.add(i, _c(i, 1) if step is None else step, flags=("nsw",))
    i.add_incoming(nxt, b.block)
    b.branch(head)
    b.position_at_end(done)


def decompose(b: ir.IRBuilder, flat, dims: Sequence, strides: Sequence[Sequence], bases: Sequence):
    """offsets[k] = bases[k] + sum_d idx[d] * strides[k][d] for the multi-index of `flat`
    (one div/rem per dim: the GPU's per-element form of strided_range)."""
    offs = list(bases)
    rem = flat
    for d in range(len(dims) - 1, -1, -1):
        idx = b.urem(rem, dims[d]) if d else rem
        offs = [madd(b, o, idx, st[d]) for o, st in zip(offs, strides)]
        if d:
            rem = b.udiv(rem, dims[d])
    return offs


def madd(b: ir.IRBuilder, base, idx, stride):
    """base + idx*stride, skipping the multiply for constant strides 0 and 1."""
    if isinstance(stride, ir.Constant) and stride.constant == 0:
        return base
    term = (
        idx
        if isinstance(stride, ir.Constant) and stride.constant == 1
        else b.mul(idx, stride, flags=("nsw",))
    )
    if isinstance(base, ir.Constant) and base.constant == 0:
        return term
    return b.add(base, term, flags=("nsw",))


def strided_range(
    b: ir.IRBuilder,
    lo,
    hi,
    dims: Sequence,
    strides: Sequence[Sequence],
    bases: Sequence,
    body: Body,
    name: str = "r",
):
    """Run body(b, offsets, flat) for flat in [lo, hi) of the C-ordered space `dims`, where
    offsets[k] = bases[k] + sum_d idx[d] * strides[k][d]. All integers share lo's type."""
    r = len(dims)
    if r == 1:

        def inner(b, j):
            body(b, [madd(b, base, j, st[0]) for base, st in zip(bases, strides)], j)

        counted_loop(b, lo, hi, inner, name)
        return
    # Multi-index of lo, kept in allocas (mem2reg turns them into registers).
    t = lo.type
    idx_slots = [entry_alloca(b, t, f"{name}.idx{d}") for d in range(r)]
    flat_slot = entry_alloca(b, t, f"{name}.flat")
    rem = lo
    for d in range(r - 1, 0, -1):
        b.store(b.urem(rem, dims[d]), idx_slots[d])
        rem = b.udiv(rem, dims[d])
    b.store(rem, idx_slots[0])
    b.store(lo, flat_slot)

    head = b.append_basic_block(f"{name}.rows")
    row = b.append_basic_block(f"{name}.row")
    done = b.append_basic_block(f"{name}.done")
    b.branch(head)
    b.position_at_end(head)
    flat = b.load(flat_slot, typ=t)
    b.cbranch(b.icmp_signed("<", flat, hi), row, done)

    b.position_at_end(row)
    idx = [b.load(s, typ=t) for s in idx_slots]
    row_base = []
    for base, st in zip(bases, strides):
        off = base
        for d in range(r - 1):
            off = madd(b, off, idx[d], st[d])
        row_base.append(off)
    j0 = idx[r - 1]
    n = b.sub(dims[r - 1], j0)
    left = b.sub(hi, flat)
    n = b.select(b.icmp_signed("<", left, n), left, n)
    j_end = b.add(j0, n)
    flat_minus_j0 = b.sub(flat, j0)

    def inner(b, j):
        offs = [madd(b, rb, j, st[r - 1]) for rb, st in zip(row_base, strides)]
        body(b, offs, b.add(flat_minus_j0, j, flags=("nsw",)))

    counted_loop(b, j0, j_end, inner, f"{name}.in")

    b.store(b.add(flat, n), flat_slot)
    b.store(_c(lo, 0), idx_slots[r - 1])
    carry = None  # branch-free carry into the outer dims
    for d in range(r - 2, -1, -1):
        v = b.add(idx[d], _c(lo, 1)) if carry is None else b.add(idx[d], b.zext(carry, t))
        wrap = b.icmp_signed("==", v, dims[d])
        b.store(b.select(wrap, _c(lo, 0), v), idx_slots[d])
        carry = wrap
    b.branch(head)
    b.position_at_end(done)


def entry_alloca(b: ir.IRBuilder, t: ir.Type, name: str = ""):
    """A stack slot in the entry block, where mem2reg promotes it to registers."""
    with b.goto_entry_block():
        return b.alloca(t, name=name)
