"""Random convolution and pooling cases (shapes, strides, paddings, dilations, groups; odd
sizes and 1x1 kernels included) shared by the adjoint, interpreter and compile tests.

    attrs, x_shape, w_shape = conv_case(rng)
    attrs, x_shape = pool_case(rng)
"""
from __future__ import annotations

import numpy as np

from dlvm_eq.ir import F64, FunctionBuilder, tensor
from dlvm_eq.ir.window_ops import out_size


def conv_case(rng, max_size: int = 7):
    """(conv2d attrs, x shape, w shape), every window fitting its padded input."""
    while True:
        g = int(rng.integers(1, 3))
        cg, og = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        n = int(rng.integers(1, 3))
        h, w = (int(v) for v in rng.integers(1, max_size + 1, 2))
        kh, kw = (int(v) for v in rng.integers(1, 4, 2))
        stride = tuple(int(v) for v in rng.integers(1, 3, 2))
        dilation = tuple(int(v) for v in rng.integers(1, 3, 2))
        padding = tuple(int(v) for v in rng.integers(0, 3, 4))
        attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": g}
        if out_size(h, kh, stride[0], padding[0], padding[1], dilation[0]) >= 1 and \
                out_size(w, kw, stride[1], padding[2], padding[3], dilation[1]) >= 1:
            return attrs, (n, g * cg, h, w), (g * og, cg, kh, kw)


def pool_case(rng, max_size: int = 7):
    """(pool attrs, x shape): overlapping windows (stride < kernel) included."""
    while True:
        kh, kw = (int(v) for v in rng.integers(1, 4, 2))
        stride = tuple(int(v) for v in rng.integers(1, 4, 2))
        padding = (int(rng.integers(0, kh // 2 + 1)),) * 2 + (int(rng.integers(0, kw // 2 + 1)),) * 2
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 3))) + \
            tuple(int(v) for v in rng.integers(1, max_size + 1, 2))
        attrs = {"kernel": (kh, kw), "stride": stride, "padding": padding}
        if shape[2] + padding[0] + padding[1] >= kh and shape[3] + padding[2] + padding[3] >= kw:
            return attrs, shape


def _fn(types, body):
    b = FunctionBuilder("f", types, [f"x{i}" for i in range(len(types))])
    return b.finish(body(b, *b.params))


def _values(rng, shape):
    return rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)


def case_window(op, rng):
    """An IR function applying `op` to random operands, and those operands (float64)."""
    if op.startswith("conv2d"):
        attrs, xs, ws = conv_case(rng)
        from dlvm_eq.ir.window_ops import conv_output_type
        ys = conv_output_type("conv2d", tensor(*xs, F64), tensor(*ws, F64), attrs).shape
        shapes, extra = {"conv2d": ((xs, ws), {}),
                         "conv2dBackwardInput": ((ys, ws), {"size": xs[2:]}),
                         "conv2dBackwardWeight": ((xs, ys), {"size": ws[2:]})}[op]
    else:
        attrs, xs = pool_case(rng)
        ps = xs[:2] + tuple(out_size(xs[2 + i], attrs["kernel"][i], attrs["stride"][i],
                                     attrs["padding"][2 * i], attrs["padding"][2 * i + 1]) for i in range(2))
        shapes, extra = {"maxPool2d": ((xs,), {}), "avgPool2d": ((xs,), {}),
                         "maxPool2dBackward": ((xs, ps), {}), "maxPool2dGather": ((xs, xs), {}),
                         "avgPool2dBackward": ((ps,), {"size": xs[2:]})}[op]
    attrs = {**attrs, **extra}
    fn = _fn([tensor(*s, F64) for s in shapes], lambda b, *xs_: b.emit(op, list(xs_), **attrs))
    return fn, [_values(rng, s) for s in shapes]
