"""Strided views: how layout ops (transpose, broadcast, shape casts) turn into element strides
that a kernel's `Load` follows, and into the numpy/CuPy view calls that BLAS and copies use.
A slice is read in place: an alias slot starts at its first element (plan.AliasStep), kernels
read it with the operand's strides, numpy/CuPy through a ("strided", (shape, strides)) link.

A view of a C-contiguous buffer is (shape, element strides); every layout op maps one view to
another without moving data, except a shape cast of a non-contiguous view, which may need a
copy (`reshape_strides` returns None then, as numpy's reshape would copy).

    >>> transpose_strides((3, 1), (1, 0))
    (1, 3)
    >>> broadcast_strides((3,), (1,), (2, 3))         # a vector read along the rows
    (0, 1)
    >>> reshape_strides((4, 6), (6, 1), (24,))         # contiguous: one flat dim
    (1,)
    >>> reshape_strides((4, 6), (1, 4), (24,)) is None # a transposed view would need a copy
    True
"""

from __future__ import annotations

import math

from ..kernels.kernel_spec import c_strides

Strides = tuple[int, ...]


class NoView(Exception):
    """A layout op that strides cannot express (a shape cast of a non-contiguous view)."""


def transpose_strides(strides: Strides, perm) -> Strides:
    return tuple(strides[p] for p in perm)


def broadcast_strides(strides: Strides, shape, to_shape) -> Strides:
    """Strides of a view of `shape` broadcast (numpy rules) to `to_shape`."""
    shape, to_shape = tuple(shape), tuple(to_shape)
    lead = len(to_shape) - len(shape)
    out = [0] * lead
    for d, s, t in zip(shape, strides, to_shape[lead:]):
        out.append(s if d == t and d != 1 else 0)
    return tuple(out)


def reshape_strides(shape, strides: Strides, new_shape) -> Strides | None:
    """Strides of `new_shape` over the same elements in C order, or None when the view's
    elements are not evenly spaced within each group of merged dims (numpy would copy)."""
    shape, new_shape = tuple(shape), tuple(new_shape)
    if math.prod(shape) != math.prod(new_shape):
        return None
    if math.prod(shape) == 0:
        return c_strides(new_shape)
    old = [(d, s) for d, s in zip(shape, strides) if d != 1]
    out: list[int] = []
    i = 0
    for n in new_shape:
        if n == 1:
            out.append(0)
            continue
        if i >= len(old):
            return None
        d, s = old[i]
        while d % n:  # merge the next old dim into this one: they must be contiguous
            if i + 1 >= len(old) or s != old[i + 1][1] * old[i + 1][0]:
                return None
            d, s = d * old[i + 1][0], old[i + 1][1]
            del old[i + 1]
        inner = d // n  # split: n outer steps of `inner` elements
        out.append(s * inner)
        if inner == 1:
            i += 1
        else:
            old[i] = (inner, s)
    if i != len(old):
        return None
    return tuple(out)


def is_contiguous(shape, strides: Strides) -> bool:
    """C-contiguous over `shape` (strides of size-1 dims do not matter)."""
    want = c_strides(tuple(shape))
    return all(d == 1 or s == w for d, s, w in zip(shape, strides, want))


def squeeze_strides(strides: Strides, at: int) -> Strides:
    return strides[:at] + strides[at + 1 :]


def pad_strides(strides: Strides, at: int) -> Strides:
    return strides[:at] + (0,) + strides[at:]


# ------------------------------------------------------------------ numpy/CuPy view chains
# A chain is a tuple of (op, arg) applied in order to a base array; the same chain works on
# numpy and CuPy arrays (both have these methods).


def apply_chain(a, chain, xp):
    for op, arg in chain:
        if op == "transpose":
            a = a.transpose(arg)
        elif op == "reshape":
            a = a.reshape(arg)
        elif op == "broadcast":
            a = xp.broadcast_to(a, arg)
        elif op == "slice":  # (axis, lo, hi): a basic index, a view on numpy and CuPy
            a = a[slice_index(a.ndim, arg)]
        elif op == "strided":  # (shape, element strides) over a flat alias (a slice in place)
            shape, strides = arg
            a = xp.lib.stride_tricks.as_strided(
                a, tuple(shape), tuple(s * a.itemsize for s in strides)
            )
        else:  # pragma: no cover - chains are built by the planner only
            raise ValueError(f"unknown view op {op!r}")
    return a


def slice_index(rank: int, arg) -> tuple:
    """numpy's index for a ("slice", (axis, lo, hi[, step])) chain link."""
    axis, lo, hi, *step = arg
    return (slice(None),) * axis + (slice(lo, hi, *step),) + (slice(None),) * (rank - axis - 1)


def chain_text(chain) -> str:
    parts = []
    for op, arg in chain:
        if op == "transpose":
            parts.append(
                ".T"
                if tuple(arg) == tuple(reversed(range(len(arg))))
                else f".transpose{tuple(arg)}"
            )
        elif op == "reshape":
            parts.append(f".reshape{tuple(arg)}")
        elif op == "slice":
            by = f":{arg[3]}" if len(arg) > 3 and arg[3] != 1 else ""
            parts.append("[" + ", ".join([":"] * arg[0] + [f"{arg[1]}:{arg[2]}{by}"]) + "]")
        elif op == "strided":
            parts.append(f"[strided {tuple(arg[1])}]")
        else:
            parts.append(f".broadcast{tuple(arg)}")
    return "".join(parts)
