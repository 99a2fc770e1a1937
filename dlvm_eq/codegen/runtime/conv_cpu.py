"""conv2d and its two adjoints on the CPU: the generated im2col / col2im kernels around one
matrix product per group and chunk of images.

    >>> y = conv2d(x, w, attrs, matmul)                   # matmul(a, b, out): 2-D products
    >>> dx = conv2d_backward_input(dy, w, attrs, matmul)
    >>> dw = conv2d_backward_weight(x, dy, attrs, matmul)

Strategy (the measurements are in the report of issue 14 and `CHUNK_BYTES`): a chunk of
images is laid out as ONE column matrix (C*KH*KW, images*OH*OW), so that each group takes one
product per chunk with a long dimension (images*OH*OW) instead of one small product per
image: numpy's OpenBLAS synchronizes its threads on every call, and 128 per-image products
(64x288 @ 288x196) measured 55 ms against 33 ms for one 64x288 @ 288x25088 (medians, 2-core
EPYC under load). The price is a transposing copy between NCHW and (O, images*OH*OW) of the
output (forward) or of dY (adjoints): 1.9 ms for 6.4 MB. The input adjoint sums the product
back with col2im, the weight adjoint accumulates one product per chunk.

Shared state (threads): none; the column matrices are scratch of the calling thread
(`_scratch`), so two threads running one program never share one.
"""
from __future__ import annotations

import threading

import numpy as np

from ..kernels.conv_spec import Col2imSpec, ConvGeometry, Im2colSpec, geometry
from .conv_kernel import compile_conv

OPS = ("conv2d", "conv2dBackwardInput", "conv2dBackwardWeight")
DTYPE_NAMES = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
# Bytes of one chunk's column matrix: the images of a chunk share one product per group.
CHUNK_BYTES = 16 << 20
MAX_SCRATCH = 8                 # scratch matrices kept per thread (one per shape)
_local = threading.local()      # .scratch: {(shape, dtype): matrix}, this thread's own


def _scratch(size: int, dtype, slot: str) -> np.ndarray:
    """A flat scratch array of at least `size` elements of this thread (reused across calls:
    fresh pages cost ~1.7 us per 4 KiB)."""
    mine = getattr(_local, "scratch", None)
    if mine is None:
        mine = _local.scratch = {}
    key = (slot, np.dtype(dtype))
    a = mine.get(key)
    if a is None or a.size < size:
        if len(mine) >= MAX_SCRATCH:
            mine.clear()
        a = mine[key] = np.empty(size, dtype)
    return a


def chunk_images(g: ConvGeometry, images: int, chunk_bytes: int | None = None) -> int:
    """Images per chunk: as many as fit CHUNK_BYTES of column matrix (at least one)."""
    per_image = g.rows * g.cols * g.itemsize
    return max(1, min(images, (chunk_bytes or CHUNK_BYTES) // per_image))


def _chunks(images: int, per: int):
    for n0 in range(0, images, per):
        yield n0, min(per, images - n0)


def _matrix(flat: np.ndarray, rows: int, cols: int) -> np.ndarray:
    return flat[:rows * cols].reshape(rows, cols)


def _to_long(a: np.ndarray, slot: str) -> np.ndarray:
    """(k, O, P) -> (O, k*P) in scratch: the NCHW images side by side."""
    k, o, p = a.shape
    t = _matrix(_scratch(o * k * p, a.dtype, slot), o, k * p)
    np.copyto(t.reshape(o, k, p), a.transpose(1, 0, 2))
    return t


def _geometry(x_shape, kernel, dtype, attrs) -> ConvGeometry:
    return geometry(DTYPE_NAMES[np.dtype(dtype)], x_shape, kernel, attrs)


def conv2d(x, w, attrs, matmul, out=None, chunk_bytes=None):
    n = x.shape[0]
    o, _, kh, kw = w.shape
    groups = attrs["groups"]
    g = _geometry(x.shape, (kh, kw), x.dtype, attrs)
    rg, og, p = g.rows // groups, o // groups, g.cols
    wm = w.reshape(groups, og, rg)
    y = np.empty((n, o) + g.out_hw, x.dtype) if out is None else out
    per = chunk_images(g, n, chunk_bytes)
    im2col = compile_conv(Im2colSpec(g))
    for n0, k in _chunks(n, per):
        cols = _matrix(_scratch(g.rows * per * p, x.dtype, "cols"), g.rows, k * p)
        im2col.run(cols, x[n0:n0 + k], k, p, k * p)
        yt = _matrix(_scratch(o * per * p, x.dtype, "long"), o, k * p)
        for i in range(groups):
            matmul(wm[i], cols[i * rg:(i + 1) * rg], yt[i * og:(i + 1) * og])
        np.copyto(y[n0:n0 + k].reshape(k, o, p), yt.reshape(o, k, p).transpose(1, 0, 2))
    return y


def conv2d_backward_input(dy, w, attrs, matmul, out=None, chunk_bytes=None):
    n, o = dy.shape[:2]
    _, cg, kh, kw = w.shape
    groups = attrs["groups"]
    g = _geometry((n, cg * groups) + tuple(attrs["size"]), (kh, kw), dy.dtype, attrs)
    rg, og, p = g.rows // groups, o // groups, g.cols
    wm = w.reshape(groups, og, rg)
    dx = np.empty((n, g.channels, g.height, g.width), dy.dtype) if out is None else out
    per = chunk_images(g, n, chunk_bytes)
    col2im = compile_conv(Col2imSpec(g))
    for n0, k in _chunks(n, per):
        dyt = _to_long(dy[n0:n0 + k].reshape(k, o, p), "long")
        dcols = _matrix(_scratch(g.rows * per * p, dy.dtype, "cols"), g.rows, k * p)
        for i in range(groups):
            matmul(wm[i].T, dyt[i * og:(i + 1) * og], dcols[i * rg:(i + 1) * rg])
        col2im.run(dx[n0:n0 + k], dcols, k, p, k * p)
    return dx


def conv2d_backward_weight(x, dy, attrs, matmul, out=None, chunk_bytes=None):
    n, c = x.shape[:2]
    o = dy.shape[1]
    groups = attrs["groups"]
    kh, kw = attrs["size"]
    g = _geometry(x.shape, (kh, kw), x.dtype, attrs)
    rg, og, p = g.rows // groups, o // groups, g.cols
    dw = np.zeros((o, c // groups, kh, kw), x.dtype) if out is None else out
    acc = dw.reshape(o, rg)
    if out is not None:
        acc.fill(0)
    part = np.empty((og, rg), x.dtype)
    per = chunk_images(g, n, chunk_bytes)
    im2col = compile_conv(Im2colSpec(g))
    for n0, k in _chunks(n, per):
        cols = _matrix(_scratch(g.rows * per * p, x.dtype, "cols"), g.rows, k * p)
        im2col.run(cols, x[n0:n0 + k], k, p, k * p)
        dyt = _to_long(dy[n0:n0 + k].reshape(k, o, p), "long")
        for i in range(groups):
            matmul(dyt[i * og:(i + 1) * og], cols[i * rg:(i + 1) * rg].T, part)
            acc[i * og:(i + 1) * og] += part
    return dw


RUNS = {"conv2d": conv2d, "conv2dBackwardInput": conv2d_backward_input,
        "conv2dBackwardWeight": conv2d_backward_weight}


def evaluate(op: str, args, attrs, matmul, out=None, chunk_bytes=None):
    """op's result (written into `out` where given: a C-contiguous array of the result's shape)."""
    return RUNS[op](args[0], args[1], attrs, matmul, out, chunk_bytes)
