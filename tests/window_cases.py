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
        if (
            out_size(h, kh, stride[0], padding[0], padding[1], dilation[0]) >= 1
            and out_size(w, kw, stride[1], padding[2], padding[3], dilation[1]) >= 1
        ):
            return attrs, (n, g * cg, h, w), (g * og, cg, kh, kw)


def pool_case(rng, max_size: int = 7):
    """(pool attrs, x shape): overlapping windows (stride < kernel) included."""
    while True:
        kh, kw = (int(v) for v in rng.integers(1, 4, 2))
        stride = tuple(int(v) for v in rng.integers(1, 4, 2))
        padding = (int(rng.integers(0, kh // 2 + 1)),) * 2 + (
            int(rng.integers(0, kw // 2 + 1)),
        ) * 2
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 3))) + tuple(
            int(v) for v in rng.integers(1, max_size + 1, 2)
        )
        attrs = {"kernel": (kh, kw), "stride": stride, "padding": padding}
        if shape[2] + padding[0] + padding[1] >= kh and shape[3] + padding[2] + padding[3] >= kw:
            return attrs, shape


def ref_conv2d(x, w, stride, padding, dilation, groups):
    """sum over taps (i, j) and input channels of x_padded[n, c, s*oh + d*i, s*ow + d*j] * w[o, c, i, j]."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    t, b, l, r = padding
    xp = np.zeros((n, c, h + t + b, wd + l + r))
    xp[:, :, t : t + h, l : l + wd] = x
    oh = (h + t + b - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + l + r - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.zeros((n, o, oh, ow))
    og = o // groups
    for oc in range(o):
        gi = oc // og
        for ci in range(cg):
            for i in range(kh):
                for j in range(kw):
                    r0, c0 = i * dilation[0], j * dilation[1]
                    patch = xp[
                        :,
                        gi * cg + ci,
                        r0 : r0 + stride[0] * (oh - 1) + 1 : stride[0],
                        c0 : c0 + stride[1] * (ow - 1) + 1 : stride[1],
                    ]
                    y[:, oc] += w[oc, ci, i, j] * patch
    return y


def ref_pool(x, kernel, stride, padding, kind):
    x = np.asarray(x, np.float64)
    n, c, h, wd = x.shape
    t, b, l, r = padding
    fill = -np.inf if kind == "max" else 0.0
    xp = np.full((n, c, h + t + b, wd + l + r), fill)
    xp[:, :, t : t + h, l : l + wd] = x
    oh = (h + t + b - kernel[0]) // stride[0] + 1
    ow = (wd + l + r - kernel[1]) // stride[1] + 1
    taps = [
        xp[
            :,
            :,
            i : i + stride[0] * (oh - 1) + 1 : stride[0],
            j : j + stride[1] * (ow - 1) + 1 : stride[1],
        ]
        for i in range(kernel[0])
        for j in range(kernel[1])
    ]
    if kind == "max":
        return np.max(taps, axis=0)
    return np.sum(taps, axis=0) / (kernel[0] * kernel[1])  # count_include_pad, as torch


def ref_max_routes(x, kernel, stride, padding):
    """For each window (n, c, oh, ow), the (row, col) of x holding its first maximum."""
    n, c, h, wd = x.shape
    t, b, l, r = padding
    oh = (h + t + b - kernel[0]) // stride[0] + 1
    ow = (wd + l + r - kernel[1]) // stride[1] + 1
    routes = {}
    for idx in np.ndindex(n, c, oh, ow):
        best = None
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                row, col = idx[2] * stride[0] + i - t, idx[3] * stride[1] + j - l
                if (
                    0 <= row < h
                    and 0 <= col < wd
                    and (best is None or x[idx[0], idx[1], row, col] > best[0])
                ):
                    best = (x[idx[0], idx[1], row, col], row, col)
        routes[idx] = best[1:]
    return routes


def check_window_op(op, rng):
    """`op` in the interpreter against the loop references: forward ops directly, adjoint ops by
    the transpose identity <dy, f(x)> = <x, f*(dy)> of the linear map they transpose (and the
    max pool's routes against the first-maximum loop)."""
    from dlvm_eq.ir.ops import OPS

    fn_args = case_window(op, rng)
    fn, args = fn_args
    attrs = fn.body[-1].attrs
    got = OPS[op].evaluate(args, attrs)
    conv = (
        {k: attrs[k] for k in ("stride", "padding", "dilation", "groups")}
        if op.startswith("conv")
        else None
    )
    if op == "conv2d":
        np.testing.assert_allclose(got, ref_conv2d(*args, **conv), rtol=1e-10, atol=1e-10)
    elif op == "conv2dBackwardInput":
        dy, w = args
        x = rng.standard_normal(got.shape)
        np.testing.assert_allclose(
            np.sum(dy * ref_conv2d(x, w, **conv)), np.sum(x * got), rtol=1e-9
        )
    elif op == "conv2dBackwardWeight":
        x, dy = args
        w = rng.standard_normal(got.shape)
        np.testing.assert_allclose(
            np.sum(dy * ref_conv2d(x, w, **conv)), np.sum(w * got), rtol=1e-9
        )
    elif op in ("maxPool2d", "avgPool2d"):
        np.testing.assert_allclose(
            got,
            ref_pool(args[0], attrs["kernel"], attrs["stride"], attrs["padding"], op[:3]),
            rtol=1e-12,
        )
    elif op == "avgPool2dBackward":
        x = rng.standard_normal(got.shape)
        want = np.sum(
            args[0] * ref_pool(x, attrs["kernel"], attrs["stride"], attrs["padding"], "avg")
        )
        np.testing.assert_allclose(want, np.sum(x * got), rtol=1e-9)
    else:
        x, v = args
        routes = ref_max_routes(x, attrs["kernel"], attrs["stride"], attrs["padding"])
        if op == "maxPool2dBackward":
            want = np.zeros_like(x)
            for (n, c, i, j), (row, col) in routes.items():
                want[n, c, row, col] += v[n, c, i, j]
        else:
            want = np.zeros(got.shape)
            for (n, c, i, j), (row, col) in routes.items():
                want[n, c, i, j] = v[n, c, row, col]
        np.testing.assert_allclose(got, want, rtol=1e-12)


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
        shapes, extra = {
            "conv2d": ((xs, ws), {}),
            "conv2dBackwardInput": ((ys, ws), {"size": xs[2:]}),
            "conv2dBackwardWeight": ((xs, ys), {"size": ws[2:]}),
        }[op]
    else:
        attrs, xs = pool_case(rng)
        ps = xs[:2] + tuple(
            out_size(
                xs[2 + i],
                attrs["kernel"][i],
                attrs["stride"][i],
                attrs["padding"][2 * i],
                attrs["padding"][2 * i + 1],
            )
            for i in range(2)
        )
        shapes, extra = {
            "maxPool2d": ((xs,), {}),
            "avgPool2d": ((xs,), {}),
            "maxPool2dBackward": ((xs, ps), {}),
            "maxPool2dGather": ((xs, xs), {}),
            "avgPool2dBackward": ((ps,), {"size": xs[2:]}),
        }[op]
    attrs = {**attrs, **extra}
    fn = _fn([tensor(*s, F64) for s in shapes], lambda b, *xs_: b.emit(op, list(xs_), **attrs))
    return fn, [_values(rng, s) for s in shapes]
