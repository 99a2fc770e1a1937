"""`einsum`, lowered to the ops the e-graph and the kernels know: transpose, shapeCast (reshape),
dot (matrix products), broadcasting multiply and reduce. No loop, no new primitive.

    dq.einsum("ij,jk->ik", a, b)      # one dot
    dq.einsum("bij,bjk->bik", a, b)   # batched: one batched matmul
    dq.einsum("ii->i", a)             # a diagonal: multiply by the identity, reduce
    dq.einsum("i,j->ij", u, v)        # an outer product: a broadcasting multiply

Operands are contracted left to right. For each pair: indices of one operand alone that the
output and later operands do not need are summed first; the shared ones needed afterwards are
batch axes, the other shared ones are contracted, by a matrix product of
(batch, free_a, contracted) and (batch, contracted, free_b) arrays. `...` stands for the
leading axes (numpy's rules: right-aligned, broadcast across operands, first in an implicit
output), spelled out as unused letters first. Not supported (a ShapeError): an index
repeated in the output.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from ..ir.types import F32
from . import ops
from .constants import arange
from .context import shape_error
from .linalg import matmul  # numpy's rules: (B, M, K) @ (B, K, N) is one batched product
from .ops import shape_of
from .primitive import promote
from .shapes import broadcast_to


def _parse(spec: str, n: int) -> tuple[list[str], str]:
    spec = spec.replace(" ", "")
    inputs, arrow, output = spec.partition("->")
    terms = inputs.split(",")
    if not re.fullmatch(r"[a-zA-Z,]*", inputs) or not re.fullmatch(r"[a-zA-Z]*", output):
        raise shape_error(f"einsum: {spec!r}: indices must be letters")
    if len(terms) != n:
        raise shape_error(f"einsum: {spec!r} names {len(terms)} operand(s), got {n}")
    if not arrow:  # numpy's implicit output: the indices used once, in alphabetical order
        counts = "".join(terms)
        output = "".join(sorted(c for c in set(counts) if counts.count(c) == 1))
    if len(set(output)) != len(output):
        raise shape_error(f"einsum: {spec!r}: an index is repeated in the output")
    missing = set(output) - set("".join(terms))
    if missing:
        raise shape_error(f"einsum: {spec!r}: output index {sorted(missing)[0]!r} is in no operand")
    return terms, output


def _sizes(terms, operands, spec) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for term, x in zip(terms, operands):
        shape = tuple(shape_of(x))
        if len(term) != len(shape):
            raise shape_error(
                f"einsum: {spec!r}: operand {term!r} has {len(shape)} axes (shape {shape})"
            )
        for c, d in zip(term, shape):
            if sizes.setdefault(c, d) != d:
                raise shape_error(f"einsum: {spec!r}: index {c!r} has sizes {sizes[c]} and {d}")
    return sizes


def einsum(spec: str, *operands):
    """Einstein summation over `operands` as `spec` says (numpy's notation, explicit `->` or
    implicit), e.g. "ij,jk->ik", "bij,bjk->bik", "ij->ji", "ij->i", "ii->i", "i,j->ij"."""
    if not operands:
        raise shape_error("einsum: needs at least one operand")
    spec, operands = _spell_ellipsis(spec, operands)
    terms, output = _parse(spec, len(operands))
    sizes = _sizes(terms, operands, spec)
    x, term = _diagonals(operands[0], terms[0], sizes)
    for i in range(1, len(operands)):
        later = set(output).union(*terms[i + 1 :])
        y, y_term = _diagonals(operands[i], terms[i], sizes)
        x, term = _sum_alone(x, term, later | set(y_term))
        y, y_term = _sum_alone(y, y_term, later | set(term))
        x, term = _contract(x, term, y, y_term, later, sizes)
    x, term = _sum_alone(x, term, set(output))
    perm = tuple(term.index(c) for c in output)
    return x if perm == tuple(range(len(perm))) else ops.transpose(x, perm)


def _spell_ellipsis(spec: str, operands) -> tuple[str, tuple]:
    """spec with each `...` replaced by letters it does not use, one per leading axis it
    stands for (right-aligned across operands, as numpy), and operands broadcast where their
    `...` axes differ; an implicit output puts them first."""
    spec = spec.replace(" ", "")
    if "..." not in spec:
        return spec, operands
    inputs, arrow, output = spec.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(operands) or spec.replace("...", "").count("."):
        raise shape_error(f"einsum: {spec!r}: a '.' outside '...', or not one term per operand")
    lead = []
    for term, x in zip(terms, operands):
        count = len(shape_of(x)) - len(term.replace("...", ""))
        if count < 0 or ("..." not in term and count):
            raise shape_error(f"einsum: {spec!r}: operand {term!r} has shape {shape_of(x)}")
        lead.append(
            tuple(shape_of(x))[term.index("...") : term.index("...") + count] if count else ()
        )
    try:
        common = np.broadcast_shapes(*lead)
    except ValueError:
        raise shape_error(f"einsum: {spec!r}: the '...' axes {lead} do not broadcast") from None
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in spec]
    letters = "".join(free[: len(common)])
    out_terms, out_ops = [], []
    for term, x, own in zip(terms, operands, lead):
        if "..." in term:
            mine = letters[len(letters) - len(own) :]
            at = term.index("...")
            want = common[len(common) - len(own) :]
            if own != want:
                shape = tuple(shape_of(x))
                x = broadcast_to(x, shape[:at] + want + shape[at + len(own) :])
            term = term.replace("...", mine)
        out_terms.append(term)
        out_ops.append(x)
    if arrow and "..." not in output and letters:
        raise shape_error(f"einsum: {spec!r}: the output needs '...' for the axes it stands for")
    if not arrow:
        joined = "".join(t for t in terms).replace("...", "")
        output = letters + "".join(sorted(c for c in set(joined) if joined.count(c) == 1))
    return ",".join(out_terms) + "->" + output.replace("...", letters), tuple(out_ops)


def _diagonals(x, term: str, sizes):
    """Repeated indices of one operand ("ii") reduced to one: multiply by the identity over
    the two axes, sum the second away."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        a, b = term.index(c), term.index(c, term.index(c) + 1)
        n = sizes[c]
        eye = ops.astype(ops.equal(ops.reshape(arange(n), (n, 1)), arange(n)), _float_of(x))
        shape = [1] * len(term)
        shape[a] = shape[b] = n
        x = ops.sum(ops.multiply(x, ops.reshape(eye, shape)), axis=b)
        term = term[:b] + term[b + 1 :]
    return x, term


def _float_of(x):
    dtype = promote([x])
    return dtype if dtype.is_float else F32


def _sum_alone(x, term: str, needed: set):
    """Sum the axes whose indices nothing after this needs."""
    axes = tuple(i for i, c in enumerate(term) if c not in needed)
    if not axes:
        return x, term
    return ops.sum(x, axes), "".join(c for c in term if c in needed)


def _contract(x, xt: str, y, yt: str, later: set, sizes):
    """x * y summed over their shared indices that `later` does not need; the result's indices
    are batch (shared and kept), then x's own, then y's own."""
    batch = [c for c in xt if c in yt and c in later]
    summed = [c for c in xt if c in yt and c not in later]
    x_own = [c for c in xt if c not in yt]
    y_own = [c for c in yt if c not in xt]
    out_term = "".join(batch + x_own + y_own)
    size = functools.partial(_product, sizes)
    if not summed:  # an outer product (per batch): a broadcasting multiply
        xs = _arranged(x, xt, batch + x_own, sizes, pad_after=len(y_own))
        ys = _arranged(y, yt, batch + y_own, sizes, pad_at=len(batch), pad=len(x_own))
        return ops.multiply(xs, ys), out_term
    b, m, k, n = size(batch), size(x_own), size(summed), size(y_own)
    xm = ops.reshape(_permuted(x, xt, batch + x_own + summed), (b, m, k))
    ym = ops.reshape(_permuted(y, yt, batch + summed + y_own), (b, k, n))
    product = (
        matmul(xm, ym)
        if b > 1
        else ops.reshape(matmul(ops.reshape(xm, (m, k)), ops.reshape(ym, (k, n))), (1, m, n))
    )
    return ops.reshape(product, tuple(sizes[c] for c in out_term)), out_term


def _product(sizes, letters) -> int:
    return int(np.prod([sizes[c] for c in letters], dtype=np.int64))


def _permuted(x, term: str, order: list[str]):
    perm = tuple(term.index(c) for c in order)
    return x if perm == tuple(range(len(perm))) else ops.transpose(x, perm)


def _arranged(x, term, order, sizes, pad_at=None, pad=0, pad_after=0):
    """x with its axes in `order`, and size-1 axes inserted for broadcasting: `pad` of them
    at `pad_at`, `pad_after` at the end."""
    x = _permuted(x, term, order)
    shape = [sizes[c] for c in order]
    if pad:
        shape[pad_at:pad_at] = [1] * pad
    shape += [1] * pad_after
    return ops.reshape(x, tuple(shape))
