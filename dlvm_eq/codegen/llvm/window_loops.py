"""Loop bodies of the convolution kernels, shared by the CPU and NVPTX back ends: one im2col
row, one col2im plane (kernels/conv_spec.py says what they compute).

    >>> im2col_row(b, row, cols, x, image_stride, row_stride, geometry)
    >>> col2im_plane(b, plane, dx, cols, image_stride, row_stride, geometry)

All integers are i64; the geometry is compiled in as constants, the two strides of the column
matrix and the image count are values (run-time arguments). Padding is never read: for each tap the range of
output positions whose input lies inside the image is computed at compile time (`_inside`),
the rest is zero-filled (im2col) or skipped (col2im), so no load is ever out of bounds.
"""

from __future__ import annotations

from llvmlite import ir

from ..kernels.conv_spec import ConvGeometry
from .loops import counted_loop, i64
from .lower_expr import storage_type


def _inside(first: int, stride: int, size: int, outputs: int) -> tuple[int, int]:
    """[lo, hi): the outputs o in [0, outputs) with 0 <= o*stride + first < size, where
    `first` is the input position of output 0 (negative inside the leading padding)."""
    lo = min(outputs, max(0, -(first // stride)) if first < 0 else 0)
    hi = min(outputs, (size - 1 - first) // stride + 1) if first <= size - 1 else 0
    return lo, max(hi, lo)


def _tap(k: int, g: ConvGeometry):
    """(row range, column range, input row and column of output (0, 0)) of tap k = ki*KW + kj:
    compile-time integers, so the kernels' loops have constant trip counts."""
    ki, kj = divmod(k, g.kernel[1])
    top = ki * g.dilation[0] - g.padding[0]
    left = kj * g.dilation[1] - g.padding[2]
    return (
        _inside(top, g.stride[0], g.height, g.out_hw[0]),
        _inside(left, g.stride[1], g.width, g.out_hw[1]),
        top,
        left,
    )


def _gep(b, ptr, off, t):
    return b.gep(ptr, [off], inbounds=True, source_etype=t)


def _fill_zero(b, ptr, lo, hi, t, name):
    zero = ir.Constant(t, 0.0)
    counted_loop(b, lo, hi, lambda b, i: b.store(zero, _gep(b, ptr, i, t)), name)


def im2col_row(b: ir.IRBuilder, item, cols, x, image_stride, row_stride, images, g: ConvGeometry):
    """cols[n*image_stride + r*row_stride + p] for p in [0, OH*OW), item = r*images + n: the
    images of one row are neighbours, so with the (R, images*P) layout a thread's items are
    written one after the other (n-major items measured 4x slower there: a new page a row).
    One switch case per tap k = r % taps, so that each case's ranges are constants (constant
    trip counts: no masked vector stores, see col2im_plane)."""
    t = storage_type(g.dtype)
    r, n = b.udiv(item, images), b.urem(item, images)
    c, k = b.udiv(r, i64(g.taps)), b.urem(r, i64(g.taps))
    src = b.mul(b.add(b.mul(n, i64(g.channels)), c), i64(g.plane))
    dst = b.add(b.mul(n, image_stride), b.mul(r, row_stride))
    done = b.append_basic_block("tap.end")
    switch = b.switch(k, done)
    for tap in range(g.taps):
        case = b.append_basic_block(f"tap{tap}")
        switch.add_case(ir.Constant(k.type, tap), case)
        b.position_at_end(case)
        _im2col_tap(b, tap, cols, x, src, dst, g, t)
        b.branch(done)
    b.position_at_end(done)


def _im2col_tap(b, k: int, cols, x, src, dst, g: ConvGeometry, t):
    """One column row of tap k (a constant) from the plane at `src` to `dst`."""
    ow_n = g.out_hw[1]
    (r_lo, r_hi), (c_lo, c_hi), top, left = _tap(k, g)
    _fill_zero(b, cols, dst, b.add(dst, i64(r_lo * ow_n)), t, "zt")
    _fill_zero(b, cols, b.add(dst, i64(r_hi * ow_n)), b.add(dst, i64(g.cols)), t, "zb")

    def out_row(b, oh):
        line = b.add(dst, b.mul(oh, i64(ow_n)))
        ih = b.add(b.mul(oh, i64(g.stride[0])), i64(top))
        base = b.add(src, b.add(b.mul(ih, i64(g.width)), i64(left)))

        def copy(b, ow):
            v = b.load(_gep(b, x, b.add(base, b.mul(ow, i64(g.stride[1]))), t), typ=t)
            b.store(v, _gep(b, cols, b.add(line, ow), t))

        _fill_zero(b, cols, line, b.add(line, i64(c_lo)), t, "zl")
        counted_loop(b, i64(c_lo), i64(c_hi), copy, "cp")
        _fill_zero(b, cols, b.add(line, i64(c_hi)), b.add(line, i64(ow_n)), t, "zr")

    counted_loop(b, i64(r_lo), i64(r_hi), out_row, "oh")


def col2im_plane(
    b: ir.IRBuilder, item, dx, cols, image_stride, row_stride, images, g: ConvGeometry
):
    """dx plane (n, c) = sum over its taps of the column rows (c, k), item = c*images + n (the
    planes of one channel are neighbours: in the (R, images*P) layout a thread's items read
    each of the channel's rows front to back; n-major items read 288 rows 100 KB apart).
    Taps are added in order k = 0, 1, ... onto a zeroed plane (the reference's order). The
    tap loop is unrolled here: each tap's row and column ranges are constants, so the loops
    have constant trip counts (with run-time ones LLVM used masked AVX stores, slow on Zen,
    and each tap's loads then missed store forwarding)."""
    t = storage_type(g.dtype)
    ow_n = g.out_hw[1]
    c, n = b.udiv(item, images), b.urem(item, images)
    out = b.mul(b.add(b.mul(n, i64(g.channels)), c), i64(g.plane))
    _fill_zero(b, dx, out, b.add(out, i64(g.plane)), t, "z")
    image = b.mul(n, image_stride)
    for k in range(g.taps):
        (r_lo, r_hi), (c_lo, c_hi), top, left = _tap(k, g)
        if r_lo == r_hi or c_lo == c_hi:
            continue  # every window element of this tap is padding
        src = b.add(image, b.mul(b.add(b.mul(c, i64(g.taps)), i64(k)), row_stride))

        def out_row(b, oh, src=src, top=top, left=left, c_lo=c_lo, c_hi=c_hi):
            line = b.add(src, b.mul(oh, i64(ow_n)))
            ih = b.add(b.mul(oh, i64(g.stride[0])), i64(top))
            base = b.add(out, b.add(b.mul(ih, i64(g.width)), i64(left)))

            def add(b, ow):
                p = _gep(b, dx, b.add(base, b.mul(ow, i64(g.stride[1]))), t)
                v = b.load(_gep(b, cols, b.add(line, ow), t), typ=t)
                b.store(b.fadd(b.load(p, typ=t), v), p)

            counted_loop(b, i64(c_lo), i64(c_hi), add, f"acc{k}")

        counted_loop(b, i64(r_lo), i64(r_hi), out_row, f"oh{k}")
