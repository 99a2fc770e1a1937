"""conv2d and its two adjoints on the CPU: the generated im2col / col2im kernels around one
matrix product per group and chunk of images.

    >>> y = conv2d(x, w, attrs, matmul)                   # matmul(a, b, out): 2-D products
    >>> dx = conv2d_backward_input(dy, w, attrs, matmul)
    >>> dw = conv2d_backward_weight(x, dy, attrs, matmul)

Strategy, per shape (`per_image`; measured by benchmarks/conv_strategies.py, table in the report
of issue 14): numpy's OpenBLAS wakes and synchronizes its second thread on every product above
about 2**18 multiply-adds, and under load each such sync costs far more than the product.
- Large per-image products (64x288 @ 288x196): ONE column matrix (C*KH*KW, n*OH*OW) for a
  chunk of images, one product per group with the long dimension n*OH*OW, then a transposing
  copy between NCHW and (O, n*OH*OW) of the output (forward) or of dY (adjoints), ~2 ms for
  6.4 MB. Chunks of CHUNK_BYTES (the whole CNN batch): conv2d (128, 32, 14, 14) 112 ms median
  against 177 (16 MB chunks), 212 (8 MB), 647 (2 MB) and 924 per image (medians of one run,
  2026-12-01, 2-core EPYC at load 5-8: the differences, not the times, carry over).
- Small per-image products (the 1-channel layer, 32x9 @ 9x784, single-threaded in OpenBLAS):
  one product per image straight into NCHW, column matrices (n, R, P), no copy: conv2d
  (128, 1, 28, 28) 25 ms against 64 (one product) and 47 (numpy's im2col). OpenBLAS runs
  products this small on the calling thread, so the images are split into blocks over the
  usable CPUs here (`_image_blocks`); the transposing copies are split the same way.
The input adjoint sums the products back with col2im, the weight adjoint adds one product
per chunk (or per image) in a fixed order: results do not depend on the thread count.
WEIGHT_PRODUCT: the weight adjoint's long product is computed transposed, dWᵀ (288 x 64) =
cols (288 x 25088) @ dYᵀ (25088 x 64): OpenBLAS took 1575 ms (median; min 412) for
dY (64 x 25088) @ colsᵀ and 148 ms (min 66) for the transposed form, same operands, same run.

Shared state (threads): none; the column matrices are scratch of the calling thread
(`_scratch`), so two threads running one program never share one. The blocks of one call run
on threads.run_python's workers and write disjoint slices of the call's own arrays.
"""

from __future__ import annotations

import threading

import numpy as np

from ..kernels.conv_spec import Col2imSpec, ConvGeometry, Im2colSpec, geometry
from . import conv_reuse
from .conv_blocks import BLOCKS, images_per_chunk, one_product_per_image
from .conv_kernel import compile_conv
from .cpu_count import usable_cpus
from .threads import run_python, split_range

OPS = ("conv2d", "conv2dBackwardInput", "conv2dBackwardWeight")
DTYPE_NAMES = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
# Blocks per thread of the per-image products and the transposing copies: a few, so that a
# descheduled thread holds up little. Python threads wake in 15-60 us and then contend for the
# GIL between numpy calls, so a block is at least BLOCK_MACS multiply-adds or BLOCK_BYTES
# copied. 1 MiB blocks (~0.1 ms) lost to 16 MiB ones in every in-process A/B here (calls
# alternating, 12-40 rounds): the small CNN (batch 32, 16x16), whose convolutions then run on
# one thread, 7.5 -> 7.2 and 6.8 -> 6.3 ms; the batch-128 CNN 77.0 -> 75.4, 74.9 -> 70.5,
# 70.8 -> 69.6 ms.
BLOCKS_PER_THREAD = 4
BLOCK_MACS = 1 << 24
BLOCK_BYTES = 1 << 24
MAX_SCRATCH = 8  # scratch matrices kept per thread (one per shape)
_local = threading.local()  # .scratch: {(shape, dtype): matrix}, this thread's own


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
    """Images per chunk: as many as fit the chunk's bytes of column matrix (at least one)."""
    blocks = {**BLOCKS, "chunk_bytes": chunk_bytes} if chunk_bytes else None
    return images_per_chunk(g.rows * g.cols * g.itemsize, images, blocks)


def per_image(g: ConvGeometry, out_channels: int, groups: int) -> bool:
    return one_product_per_image((out_channels // groups) * (g.rows // groups) * g.cols)


def _blocks(fn, n: int, size: int, per_block: int) -> None:
    """fn(i0, i1) for blocks of range(n) on the usable CPUs; `size` (work or bytes) over
    `per_block` bounds the block count. Each block writes its own results only."""
    threads = usable_cpus()
    blocks = max(1, min(n, BLOCKS_PER_THREAD * threads, size // per_block))
    run_python(fn, split_range(n, blocks, 1), threads)


def _image_blocks(k: int, macs: int, product) -> None:
    """product(i0, i1) for blocks of a chunk's k images (`macs` multiply-adds in all): each
    per-image product is too small for OpenBLAS to thread (PER_IMAGE_MACS), so the images
    are split here instead."""
    _blocks(product, k, macs, BLOCK_MACS)


def _stacked(a: np.ndarray, k: int, rows: int, cols: int) -> np.ndarray:
    return a[: k * rows * cols].reshape(k, rows, cols)


def _chunks(images: int, per: int):
    for n0 in range(0, images, per):
        yield n0, min(per, images - n0)


def _matrix(flat: np.ndarray, rows: int, cols: int) -> np.ndarray:
    return flat[: rows * cols].reshape(rows, cols)


def _to_long(a: np.ndarray, slot: str) -> np.ndarray:
    """(k, O, P) -> (O, k*P) in scratch: the NCHW images side by side."""
    k, o, p = a.shape
    t = _matrix(_scratch(o * k * p, a.dtype, slot), o, k * p)
    _copy_blocks(t.reshape(o, k, p), a.transpose(1, 0, 2))
    return t


def _copy_blocks(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src in blocks of the first axis on the usable CPUs (numpy copies on one
    thread, without the GIL): the transposing copies move 6.4 MB per call in the CNN."""

    def copy(a, b):
        np.copyto(dst[a:b], src[a:b])

    _blocks(copy, dst.shape[0], dst.nbytes, BLOCK_BYTES)


def _geometry(x_shape, kernel, dtype, attrs) -> ConvGeometry:
    return geometry(DTYPE_NAMES[np.dtype(dtype)], x_shape, kernel, attrs)


def geometry_for(op: str, a_shape, b_shape, dtype, attrs) -> ConvGeometry:
    """The geometry `op` works in, from its operands' shapes (conv2d: x, w; the input
    adjoint: dy, w; the weight adjoint: x, dy)."""
    if op == "conv2dBackwardInput":
        x_shape = (a_shape[0], b_shape[1] * attrs["groups"]) + tuple(attrs["size"])
        return _geometry(x_shape, tuple(b_shape[2:]), dtype, attrs)
    kernel = tuple(b_shape[2:]) if op == "conv2d" else tuple(attrs["size"])
    return _geometry(a_shape, kernel, dtype, attrs)


def kernel_spec(op: str, a_shape, b_shape, dtype, attrs) -> Im2colSpec | Col2imSpec:
    """The im2col or col2im kernel `evaluate(op, ...)` runs on operands of these shapes: a
    plan builds it with its other kernels (in the compile's `kernels` phase), not on the
    first call."""
    g = geometry_for(op, a_shape, b_shape, dtype, attrs)
    return Col2imSpec(g) if op == "conv2dBackwardInput" else Im2colSpec(g)


def conv2d(x, w, attrs, matmul, out=None, chunk_bytes=None, small=None):
    n = x.shape[0]
    o = w.shape[0]
    groups = attrs["groups"]
    g = geometry_for("conv2d", x.shape, w.shape, x.dtype, attrs)
    rg, og, p = g.rows // groups, o // groups, g.cols
    wm = w.reshape(groups, og, rg)
    y = np.empty((n, o) + g.out_hw, x.dtype) if out is None else out
    per = chunk_images(g, n, chunk_bytes)
    im2col = compile_conv(Im2colSpec(g))
    small = per_image(g, o, groups) if small is None else small
    for n0, k in _chunks(n, per):
        if small:  # numpy's stacked matmul: products this small are never our GEMM's
            cols = _stacked(_scratch(g.rows * per * p, x.dtype, "cols"), k, g.rows, p)
            im2col.run(cols, x[n0 : n0 + k], k, g.rows * p, p)
            yk = y[n0 : n0 + k].reshape(k, o, p)

            def forward(a, b, cols=cols, yk=yk):
                for i in range(groups):
                    np.matmul(
                        wm[i], cols[a:b, i * rg : (i + 1) * rg], out=yk[a:b, i * og : (i + 1) * og]
                    )

            _image_blocks(k, k * o * g.rows // groups * p, forward)
            continue
        whole = k == n and x.flags.c_contiguous  # one chunk: kept for the weight adjoint
        cols = (
            conv_reuse.forward_matrix(g, n, x.dtype)
            if whole
            else _matrix(_scratch(g.rows * per * p, x.dtype, "cols"), g.rows, k * p)
        )
        im2col.run(cols, x[n0 : n0 + k], k, p, k * p)
        if whole:
            conv_reuse.remember(x, g)
        yt = _matrix(_scratch(o * per * p, x.dtype, "long"), o, k * p)
        for i in range(groups):
            matmul(wm[i], cols[i * rg : (i + 1) * rg], yt[i * og : (i + 1) * og])
        _copy_blocks(y[n0 : n0 + k].reshape(k, o, p), yt.reshape(o, k, p).transpose(1, 0, 2))
    return y


def conv2d_backward_input(dy, w, attrs, matmul, out=None, chunk_bytes=None, small=None):
    n, o = dy.shape[:2]
    groups = attrs["groups"]
    g = geometry_for("conv2dBackwardInput", dy.shape, w.shape, dy.dtype, attrs)
    rg, og, p = g.rows // groups, o // groups, g.cols
    wm = w.reshape(groups, og, rg)
    dx = np.empty((n, g.channels, g.height, g.width), dy.dtype) if out is None else out
    per = chunk_images(g, n, chunk_bytes)
    col2im = compile_conv(Col2imSpec(g))
    small = per_image(g, o, groups) if small is None else small
    for n0, k in _chunks(n, per):
        if small:
            dyk = dy[n0 : n0 + k].reshape(k, o, p)
            dcols = _stacked(_scratch(g.rows * per * p, dy.dtype, "cols"), k, g.rows, p)

            def adjoint(a, b, dyk=dyk, dcols=dcols):
                for i in range(groups):
                    np.matmul(
                        wm[i].T,
                        dyk[a:b, i * og : (i + 1) * og],
                        out=dcols[a:b, i * rg : (i + 1) * rg],
                    )

            _image_blocks(k, k * o * g.rows // groups * p, adjoint)
            col2im.run(dx[n0 : n0 + k], dcols, k, g.rows * p, p)
            continue
        dyt = _to_long(dy[n0 : n0 + k].reshape(k, o, p), "long")
        dcols = _matrix(_scratch(g.rows * per * p, dy.dtype, "cols"), g.rows, k * p)
        for i in range(groups):
            matmul(wm[i].T, dyt[i * og : (i + 1) * og], dcols[i * rg : (i + 1) * rg])
        col2im.run(dx[n0 : n0 + k], dcols, k, p, k * p)
    return dx


def conv2d_backward_weight(x, dy, attrs, matmul, out=None, chunk_bytes=None, small=None):
    n, c = x.shape[:2]
    o = dy.shape[1]
    groups = attrs["groups"]
    kh, kw = attrs["size"]
    g = geometry_for("conv2dBackwardWeight", x.shape, dy.shape, x.dtype, attrs)
    rg, og, p = g.rows // groups, o // groups, g.cols
    dw = np.zeros((o, c // groups, kh, kw), x.dtype) if out is None else out
    acc = dw.reshape(o, rg)
    if out is not None:
        acc.fill(0)
    part = np.empty((rg, og), x.dtype)
    per = chunk_images(g, n, chunk_bytes)
    im2col = compile_conv(Im2colSpec(g))
    small = per_image(g, o, groups) if small is None else small
    for n0, k in _chunks(n, per):
        if small:
            cols = _stacked(_scratch(g.rows * per * p, x.dtype, "cols"), k, g.rows, p)
            im2col.run(cols, x[n0 : n0 + k], k, g.rows * p, p)
            dyk = dy[n0 : n0 + k].reshape(k, o, p)
            parts = np.empty((k, groups, og, rg), x.dtype)

            def weight(a, b, cols=cols, dyk=dyk, parts=parts):
                for i in range(groups):
                    np.matmul(
                        dyk[a:b, i * og : (i + 1) * og],
                        cols[a:b, i * rg : (i + 1) * rg].transpose(0, 2, 1),
                        out=parts[a:b, i],
                    )

            _image_blocks(k, k * o * g.rows // groups * p, weight)
            acc += parts.sum(axis=0).reshape(o, rg)  # one fixed order, whatever the blocks
            continue
        cols = conv_reuse.kept_matrix(x, g) if k == n else None  # the forward's, see conv_reuse
        if cols is None:
            cols = _matrix(_scratch(g.rows * per * p, x.dtype, "cols"), g.rows, k * p)
            im2col.run(cols, x[n0 : n0 + k], k, p, k * p)
        dyt = _to_long(dy[n0 : n0 + k].reshape(k, o, p), "long")
        for i in range(groups):  # dWᵀ = cols · dYᵀ: see WEIGHT_PRODUCT
            matmul(cols[i * rg : (i + 1) * rg], dyt[i * og : (i + 1) * og].T, part)
            acc[i * og : (i + 1) * og] += part.T
    return dw


def _grow(sizes: dict, key: tuple, size: int) -> None:
    sizes[key] = max(sizes.get(key, 0), size)


def reserve(convs) -> list[np.ndarray]:
    """This thread's scratch (column and transposing matrices) and forward column matrices for
    `evaluate` of each (op, a_shape, b_shape, dtype, attrs) in `convs` with C-contiguous
    operands, allocated now at the sizes those calls ask for and returned, not written: the
    executor faults them in on a helper thread before the first call (execution/window_steps.py,
    runtime/prefault.py), as it does its arena. Sizes are the largest per scratch slot, so
    that no later call replaces one of them by a larger matrix."""
    sizes: dict[tuple, int] = {}  # (slot, dtype) -> elements
    forward = []
    for op, a_shape, b_shape, dtype, attrs in convs:
        g = geometry_for(op, a_shape, b_shape, dtype, attrs)
        n = a_shape[0]
        # output channels: w's first axis for conv2d, dY's second for the two adjoints
        o = {"conv2d": b_shape[0], "conv2dBackwardInput": a_shape[1]}.get(op, b_shape[1])
        per, p = chunk_images(g, n), g.cols
        long = not per_image(g, o, attrs["groups"])  # one product per chunk, not per image
        if op == "conv2d" and long and per >= n:
            forward.append((g, n, dtype))  # one chunk: the matrix kept for the weight adjoint
        elif not (op == "conv2dBackwardWeight" and long and per >= n):  # that one reads it
            _grow(sizes, ("cols", np.dtype(dtype)), g.rows * per * p)
        if long:
            _grow(sizes, ("long", np.dtype(dtype)), o * per * p)
    out = [_scratch(size, dtype, slot) for (slot, dtype), size in sorted(sizes.items(), key=str)]
    return out + [conv_reuse.reserve(g, n, dtype) for g, n, dtype in forward]


RUNS = {
    "conv2d": conv2d,
    "conv2dBackwardInput": conv2d_backward_input,
    "conv2dBackwardWeight": conv2d_backward_weight,
}


def evaluate(op: str, args, attrs, matmul, out=None, chunk_bytes=None, small=None):
    """op's result (written into `out` where given: a C-contiguous array of the result's
    shape); chunk_bytes and small (one product per image or not) override the rule."""
    return RUNS[op](args[0], args[1], attrs, matmul, out, chunk_bytes, small)
