"""The forward's column matrix kept for the weight adjoint (runtime/conv_cpu.py): a training
step runs conv2d(x, w) and later conv2dBackwardWeight(x, dY) on the same x, whose column
matrix the forward has built already (the CNN's second layer: 29 MB, ~3.5 ms of im2col).

    >>> cols = forward_matrix(g, images, dtype)   # the forward fills it with im2col, then
    >>> remember(x, g)                            # keeps a copy of x's bits
    >>> cols = kept_matrix(x, g)                  # the adjoint: that matrix, or None

The matrix is reused only where the adjoint's x has the forward's bits exactly (compared in
full against the kept copy: 3.2 MB copied and compared, ~0.3 ms each, against 3.5 ms of
im2col) and the geometry is the same; anything else gets None and recomputes, so a stale
matrix is never used. One matrix per thread, the last forward's (the steps of one program
call run on the calling thread); it costs one more column matrix of memory per thread.

Shared state (threads): `_local` only (thread-local: a thread never sees another's matrix).
"""

from __future__ import annotations

import threading

import numpy as np

from ...records import dataclass
from ..kernels.conv_spec import ConvGeometry


@dataclass
class _Kept:
    """A column matrix kept for reuse, with the geometry and input bits it was built from."""

    matrix: np.ndarray
    geometry: ConvGeometry | None = None  # None: the matrix holds nothing valid
    x_bits: np.ndarray | None = None


_local = threading.local()  # .kept: this thread's {(shape, dtype): _Kept}
# Column matrices kept per thread, one per shape: a network's convolutions each keep their own
# (with one for all, the CNN's two layers took turns: each forward threw the other's matrix
# away, allocated its own afresh, and the first layer's weight adjoint never found its own).
MAX_KEPT = 4


def _bits(a: np.ndarray) -> np.ndarray:
    """a's bytes as integers (NaN and -0.0 compare by their bits); a is C-contiguous."""
    flat = a.reshape(-1).view(np.uint8)
    return flat.view(np.uint64) if flat.size % 8 == 0 else flat


def _mine() -> dict:
    kept = getattr(_local, "kept", None)
    if kept is None:
        kept = _local.kept = {}
    return kept


def _key(g: ConvGeometry, images: int, dtype) -> tuple:
    return (g.rows, images * g.cols), np.dtype(dtype)


def forward_matrix(g: ConvGeometry, images: int, dtype) -> np.ndarray:
    """The (R, images*P) matrix the forward writes its columns into; what it held is
    forgotten until `remember`."""
    mine, key = _mine(), _key(g, images, dtype)
    kept = mine.get(key)
    if kept is None:
        if len(mine) >= MAX_KEPT:
            mine.clear()
        kept = mine[key] = _Kept(np.empty(key[0], dtype))
    kept.geometry = None
    return kept.matrix


def reserve(g: ConvGeometry, images: int, dtype) -> np.ndarray:
    """forward_matrix's matrix for this geometry, made now if there is none, with what it holds
    left as it is (conv_cpu.reserve: the executor faults it in before the first call)."""
    mine, key = _mine(), _key(g, images, dtype)
    kept = mine.get(key)
    if kept is None:
        if len(mine) >= MAX_KEPT:
            mine.clear()
        kept = mine[key] = _Kept(np.empty(key[0], dtype))
    return kept.matrix


def remember(x: np.ndarray, g: ConvGeometry) -> None:
    """forward_matrix(g, ...) now holds the column matrix of x (C-contiguous) for geometry g."""
    kept = _mine()[_key(g, x.shape[0], x.dtype)]
    if kept.x_bits is None or kept.x_bits.shape != x.shape or kept.x_bits.dtype != x.dtype:
        kept.x_bits = np.empty_like(x)
    np.copyto(kept.x_bits, x)
    kept.geometry = g


def kept_matrix(x: np.ndarray, g: ConvGeometry) -> np.ndarray | None:
    """This thread's last forward column matrix for geometry g if it is x's, else None."""
    if not x.flags.c_contiguous:
        return None
    kept = _mine().get(_key(g, x.shape[0], x.dtype))
    if kept is None or kept.geometry != g:
        return None
    if kept.x_bits.shape != x.shape or kept.x_bits.dtype != x.dtype:
        return None
    return kept.matrix if np.array_equal(_bits(kept.x_bits), _bits(x)) else None
