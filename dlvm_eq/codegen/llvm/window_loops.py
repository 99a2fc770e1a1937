"""Loop bodies of the convolution kernels, shared by the CPU and NVPTX back ends: one im2col
row, one col2im plane (kernels/conv_spec.py says what they compute).

    >>> im2col_row(b, row, cols, x, image_stride, row_stride, geometry)
    >>> col2im_plane(b, plane, dx, cols, image_stride, row_stride, geometry)

All integers are i64; the geometry is compiled in as constants, the two strides of the column
matrix and the image count are values (run-time arguments). Padding is never read: for each tap the range of
output positions whose input lies inside the image is computed once (`_inside`), the rest
is zero-filled (im2col) or skipped (col2im), so no load is ever out of bounds.
"""
from __future__ import annotations

from llvmlite import ir

from ..kernels.conv_spec import ConvGeometry
from .loops import counted_loop, i64
from .lower_expr import storage_type


def _min(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def _max(b, x, y):
    return b.select(b.icmp_signed(">", x, y), x, y)


def _inside(b, first, stride: int, size: int, outputs: int):
    """[lo, hi): the outputs o in [0, outputs) with 0 <= o*stride + first < size, where
    `first` is the input position of output 0 (negative inside the leading padding)."""
    zero = i64(0)
    neg = b.sub(zero, first)                         # o >= ceil(-first / stride)
    lo = b.select(b.icmp_signed("<=", neg, zero), zero,
                  b.sdiv(b.add(neg, i64(stride - 1)), i64(stride)))
    lo = _min(b, lo, i64(outputs))
    last = b.sub(i64(size - 1), first)               # o <= floor((size-1-first) / stride)
    hi = b.select(b.icmp_signed("<", last, zero), zero,
                  _min(b, b.add(b.sdiv(last, i64(stride)), i64(1)), i64(outputs)))
    return lo, _max(b, hi, lo)


def _tap(b, k, g: ConvGeometry):
    """(row range, column range, input offset of output (0, 0)) of tap k = ki*KW + kj."""
    kh, kw = g.kernel
    ki, kj = (b.udiv(k, i64(kw)), b.urem(k, i64(kw))) if kw > 1 else (k, i64(0))
    top = b.sub(b.mul(ki, i64(g.dilation[0])), i64(g.padding[0]))    # input row of oh = 0
    left = b.sub(b.mul(kj, i64(g.dilation[1])), i64(g.padding[2]))   # input column of ow = 0
    rows = _inside(b, top, g.stride[0], g.height, g.out_hw[0])
    cols = _inside(b, left, g.stride[1], g.width, g.out_hw[1])
    return rows, cols, top, left


def _gep(b, ptr, off, t):
    return b.gep(ptr, [off], inbounds=True, source_etype=t)


def _fill_zero(b, ptr, lo, hi, t, name):
    zero = ir.Constant(t, 0.0)
    counted_loop(b, lo, hi, lambda b, i: b.store(zero, _gep(b, ptr, i, t)), name)


def im2col_row(b: ir.IRBuilder, item, cols, x, image_stride, row_stride, images, g: ConvGeometry):
    """cols[n*image_stride + r*row_stride + p] for p in [0, OH*OW), item = r*images + n: the
    images of one row are neighbours, so with the (R, images*P) layout a thread's items are
    written one after the other (n-major items measured 4x slower there: a new page a row)."""
    t = storage_type(g.dtype)
    oh_n, ow_n = g.out_hw
    r, n = b.udiv(item, images), b.urem(item, images)
    c, k = b.udiv(r, i64(g.taps)), b.urem(r, i64(g.taps))
    (r_lo, r_hi), (c_lo, c_hi), top, left = _tap(b, k, g)
    src = b.mul(b.add(b.mul(n, i64(g.channels)), c), i64(g.plane))
    dst = b.add(b.mul(n, image_stride), b.mul(r, row_stride))
    _fill_zero(b, cols, dst, b.add(dst, b.mul(r_lo, i64(ow_n))), t, "zt")
    _fill_zero(b, cols, b.add(dst, b.mul(r_hi, i64(ow_n))), b.add(dst, i64(g.cols)), t, "zb")

    def out_row(b, oh):
        line = b.add(dst, b.mul(oh, i64(ow_n)))
        ih = b.add(b.mul(oh, i64(g.stride[0])), top)
        base = b.add(src, b.add(b.mul(ih, i64(g.width)), left))

        def copy(b, ow):
            v = b.load(_gep(b, x, b.add(base, b.mul(ow, i64(g.stride[1]))), t), typ=t)
            b.store(v, _gep(b, cols, b.add(line, ow), t))
        _fill_zero(b, cols, line, b.add(line, c_lo), t, "zl")
        counted_loop(b, c_lo, c_hi, copy, "cp")
        _fill_zero(b, cols, b.add(line, c_hi), b.add(line, i64(ow_n)), t, "zr")
    counted_loop(b, r_lo, r_hi, out_row, "oh")


def _inside_at(first: int, stride: int, size: int, outputs: int) -> tuple[int, int]:
    """_inside for a compile-time `first`: [lo, hi) as Python ints (hi >= lo)."""
    lo = min(outputs, max(0, -(first // stride)) if first < 0 else 0)
    hi = min(outputs, (size - 1 - first) // stride + 1) if first <= size - 1 else 0
    return lo, max(hi, lo)


def _tap_at(k: int, g: ConvGeometry):
    """_tap for a compile-time tap k: (row range, column range, top, left) as Python ints."""
    ki, kj = divmod(k, g.kernel[1])
    top = ki * g.dilation[0] - g.padding[0]
    left = kj * g.dilation[1] - g.padding[2]
    return (_inside_at(top, g.stride[0], g.height, g.out_hw[0]),
            _inside_at(left, g.stride[1], g.width, g.out_hw[1]), top, left)


def col2im_plane(b: ir.IRBuilder, item, dx, cols, image_stride, row_stride, images, g: ConvGeometry):
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
        (r_lo, r_hi), (c_lo, c_hi), top, left = _tap_at(k, g)
        if r_lo == r_hi or c_lo == c_hi:
            continue                      # every window element of this tap is padding
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
