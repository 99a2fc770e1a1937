"""Convolution and pooling ops: their attributes, type rules and array semantics.

NCHW inputs, OIHW weights, semantics of torch.nn.functional.conv2d / max_pool2d / avg_pool2d
(avg pools divide by the full window, count_include_pad=True as torch's default; max pools
pad with -inf and route a gradient to the first maximum of a window, as torch does).

    %y = conv2d %x: <8 x 3 x 28 x 28 x f32>, %w: <16 x 3 x 3 x 3 x f32> stride [1, 1] padding [1, 1] dilation [1, 1] groups 1
    %p = maxPool2d %y: <8 x 16 x 28 x 28 x f32> kernel [2, 2] stride [2, 2] padding [0, 0]

Attributes are tuples of ints: stride (sh, sw), dilation (dh, dw), kernel (kh, kw), size
(h, w: the spatial size a backward op produces), padding (top, bottom, left, right; printed
as [ph, pw] when symmetric), groups an int. The adjoints are ops of the same family:
conv2dBackwardInput (a transposed convolution: col2im of dY times the weights),
conv2dBackwardWeight (im2col(x)ᵀ-style products with dY), maxPool2dBackward (dY to each
window's argmax), maxPool2dGather (its adjoint: g read at each window's argmax),
avgPool2dBackward (dY / window size spread over each window).

The algorithms are written against an array module `xp` (numpy here, CuPy on the GPU) and an
optional `matmul(a, b, out)`, so that code generation runs the same im2col + GEMM plan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from ..errors import IRError
from .types import TensorType

CONV_OPS = ("conv2d", "conv2dBackwardInput", "conv2dBackwardWeight")
POOL_OPS = ("maxPool2d", "maxPool2dBackward", "maxPool2dGather", "avgPool2d", "avgPool2dBackward")
WINDOW_OPS = CONV_OPS + POOL_OPS

# attribute names (printed order) and how many ints each holds
_CONV_ATTRS = (("stride", 2), ("padding", 4), ("dilation", 2), ("groups", 1))
_POOL_ATTRS = (("kernel", 2), ("stride", 2), ("padding", 4))
ATTR_LAYOUT = {
    "conv2d": _CONV_ATTRS,
    "conv2dBackwardInput": _CONV_ATTRS + (("size", 2),),
    "conv2dBackwardWeight": _CONV_ATTRS + (("size", 2),),
    "maxPool2d": _POOL_ATTRS,
    "maxPool2dBackward": _POOL_ATTRS,
    "maxPool2dGather": _POOL_ATTRS,
    "avgPool2d": _POOL_ATTRS,
    "avgPool2dBackward": _POOL_ATTRS + (("size", 2),),
}
ARITY = {
    "conv2d": 2,
    "conv2dBackwardInput": 2,
    "conv2dBackwardWeight": 2,
    "maxPool2d": 1,
    "maxPool2dBackward": 2,
    "maxPool2dGather": 2,
    "avgPool2d": 1,
    "avgPool2dBackward": 1,
}
# maxPool2dBackward and maxPool2dGather route by x's argmax: piecewise constant in x
NONDIFF = {"maxPool2dBackward": (0,), "maxPool2dGather": (0,)}


def attr_names(op: str) -> tuple[str, ...]:
    return tuple(name for name, _ in ATTR_LAYOUT[op])


def attr_count(op: str, name: str) -> int:
    return dict(ATTR_LAYOUT[op])[name]


def pack(op: str, attrs: dict) -> tuple[int, ...]:
    """The attributes as one flat int vector (the e-graph's IVec child), in printed order."""
    out: list[int] = []
    for name, n in ATTR_LAYOUT[op]:
        v = attrs[name]
        out.extend([int(v)] if n == 1 else [int(x) for x in v])
    return tuple(out)


def unpack(op: str, flat) -> dict:
    attrs, i = {}, 0
    for name, n in ATTR_LAYOUT[op]:
        attrs[name] = int(flat[i]) if n == 1 else tuple(int(x) for x in flat[i : i + n])
        i += n
    return attrs


def out_size(n: int, k: int, stride: int, lo: int, hi: int, dilation: int = 1) -> int:
    """Output length of a window of k taps (dilated) sliding over n + lo + hi positions."""
    return (n + lo + hi - dilation * (k - 1) - 1) // stride + 1


def _fail(op: str, msg: str) -> NoReturn:
    raise IRError(f"{op}: {msg}")


def _check_attrs(op: str, attrs: dict) -> None:
    for name, n in ATTR_LAYOUT[op]:
        v = attrs.get(name)
        vals: tuple | None = (v,) if n == 1 else v
        if (
            vals is None
            or len(vals) != n
            or any(not isinstance(x, (int, np.integer)) for x in vals)
        ):
            _fail(op, f"{name} must be {n} integer{'s' * (n != 1)}, got {v!r}")
        floor = 0 if name == "padding" else 1
        if any(x < floor for x in vals):
            _fail(op, f"{name} {list(vals)} must be {'non-negative' if floor == 0 else 'positive'}")


def _tensor4(op: str, what: str, t) -> TensorType:
    if not isinstance(t, TensorType) or t.rank != 4:
        _fail(op, f"{what} must be a rank-4 tensor, got {t}")
    if not t.dtype.is_float:
        _fail(op, f"{what} must be f32 or f64, got {t}")
    return t


def _spatial(op: str, hw, kernel, stride, padding, dilation=(1, 1)) -> tuple[int, int]:
    oh = out_size(hw[0], kernel[0], stride[0], padding[0], padding[1], dilation[0])
    ow = out_size(hw[1], kernel[1], stride[1], padding[2], padding[3], dilation[1])
    if oh < 1 or ow < 1:
        _fail(
            op,
            f"the window ({kernel[0]} x {kernel[1]}, dilation {list(dilation)}) does not fit "
            f"the padded input {hw[0] + padding[0] + padding[1]} x {hw[1] + padding[2] + padding[3]}",
        )
    return oh, ow


def conv_output_type(op: str, x: TensorType, w: TensorType, attrs: dict) -> TensorType:
    """conv2d's result type for input x (N, C, H, W) and weights w (O, C/groups, KH, KW)."""
    g = attrs["groups"]
    if x.dtype != w.dtype:
        _fail(op, f"input and weights have different data types: {x}, {w}")
    if x.shape[1] != w.shape[1] * g:
        _fail(
            op,
            f"input has {x.shape[1]} channels but the weights {w} take {w.shape[1]} per group "
            f"x {g} group{'s' * (g != 1)}",
        )
    if w.shape[0] % g:
        _fail(op, f"{w.shape[0]} output channels do not split into {g} groups")
    oh, ow = _spatial(
        op, x.shape[2:], w.shape[2:], attrs["stride"], attrs["padding"], attrs["dilation"]
    )
    return TensorType((x.shape[0], w.shape[0], oh, ow), x.dtype)


def _pool_output_type(op: str, x: TensorType, attrs: dict) -> TensorType:
    k, p = attrs["kernel"], attrs["padding"]
    if op.startswith("max") and (max(p[0], p[1]) > k[0] // 2 or max(p[2], p[3]) > k[1] // 2):
        _fail(
            op, f"padding {list(p)} must be at most half the kernel {list(k)} (as torch requires)"
        )
    oh, ow = _spatial(op, x.shape[2:], k, attrs["stride"], p)
    return x.with_shape(x.shape[:2] + (oh, ow))


def _expect(op: str, what: str, t: TensorType, want: TensorType) -> None:
    if t != want:
        _fail(op, f"{what} is {t} but must be {want}")


def result_type(op: str, types: list, attrs: dict) -> TensorType:
    _check_attrs(op, attrs)
    if len(types) != ARITY[op]:
        _fail(op, f"takes {ARITY[op]} operands, got {len(types)}")
    ts = [_tensor4(op, f"operand {i}", t) for i, t in enumerate(types)]
    if op == "conv2d":
        return conv_output_type(op, ts[0], ts[1], attrs)
    if op == "conv2dBackwardInput":  # (dy, w) -> x
        dy, w = ts
        x = TensorType((dy.shape[0], w.shape[1] * attrs["groups"]) + tuple(attrs["size"]), dy.dtype)
        _expect(op, "dY", dy, conv_output_type(op, x, w, attrs))
        return x
    if op == "conv2dBackwardWeight":  # (x, dy) -> w
        x, dy = ts
        g = attrs["groups"]
        if x.shape[1] % g:
            _fail(op, f"{x.shape[1]} input channels do not split into {g} groups")
        w = TensorType((dy.shape[1], x.shape[1] // g) + tuple(attrs["size"]), x.dtype)
        _expect(op, "dY", dy, conv_output_type(op, x, w, attrs))
        return w
    if op in ("maxPool2d", "avgPool2d"):
        return _pool_output_type(op, ts[0], attrs)
    if op == "maxPool2dBackward":  # (x, dy) -> x's type
        _expect(op, "dY", ts[1], _pool_output_type(op, ts[0], attrs))
        return ts[0]
    if op == "maxPool2dGather":  # (x, g) -> the pooled type
        _expect(op, "g", ts[1], ts[0])
        return _pool_output_type(op, ts[0], attrs)
    assert op == "avgPool2dBackward"  # (dy) -> x
    dy = ts[0]
    x = dy.with_shape(dy.shape[:2] + tuple(attrs["size"]))
    _expect(op, "dY", dy, _pool_output_type(op, x, attrs))
    return x


# ---------------------------------------------------------------- the algorithms (xp-generic)


def _as_strided(xp, a, shape, strides):
    if xp is np:
        return np.lib.stride_tricks.as_strided(a, shape, strides, writeable=False)
    return xp.lib.stride_tricks.as_strided(a, shape, strides)


def padded(xp, x, padding, value=0.0):
    t, b, l, r = padding
    if not any(padding):
        return x
    out = xp.full(x.shape[:2] + (x.shape[2] + t + b, x.shape[3] + l + r), value, x.dtype)
    out[:, :, t : t + x.shape[2], l : l + x.shape[3]] = x
    return out


def windows(xp, xp_in, kernel, stride, dilation, out_hw):
    """The im2col view of a padded NCHW array: shape (N, C, KH, KW, OH, OW), no copy."""
    a = xp.ascontiguousarray(xp_in)
    n, c, _, _ = a.shape
    s = a.strides
    shape = (n, c, kernel[0], kernel[1], out_hw[0], out_hw[1])
    strides = (
        s[0],
        s[1],
        s[2] * dilation[0],
        s[3] * dilation[1],
        s[2] * stride[0],
        s[3] * stride[1],
    )
    return _as_strided(xp, a, shape, strides)


def col2im(xp, cols, padded_hw, stride, dilation):
    """Sum every window element of cols (N, C, KH, KW, OH, OW) back to its padded position."""
    n, c, kh, kw, oh, ow = cols.shape
    out = xp.zeros((n, c) + tuple(padded_hw), cols.dtype)
    for i in range(kh):
        for j in range(kw):
            r, q = i * dilation[0], j * dilation[1]
            out[
                :,
                :,
                r : r + stride[0] * (oh - 1) + 1 : stride[0],
                q : q + stride[1] * (ow - 1) + 1 : stride[1],
            ] += cols[:, :, i, j]
    return out


def _crop(a, padding, hw):
    t, _, l, _ = padding
    return a[:, :, t : t + hw[0], l : l + hw[1]]


def _np_matmul(a, b, out=None):
    return np.matmul(a, b, out=out)


def conv2d(xp, x, w, attrs, matmul=None):
    """im2col + one GEMM per group: cols (g, Cg*KH*KW, N*OH*OW), weights (g, Og, Cg*KH*KW)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    g = attrs["groups"]
    oh, ow = _spatial(
        "conv2d", (h, wd), (kh, kw), attrs["stride"], attrs["padding"], attrs["dilation"]
    )
    cols = windows(
        xp, padded(xp, x, attrs["padding"]), (kh, kw), attrs["stride"], attrs["dilation"], (oh, ow)
    )
    # (g, Cg, KH, KW, N, OH, OW): one contiguous copy (the im2col matrix), then products
    cols = xp.ascontiguousarray(
        cols.reshape(n, g, cg, kh, kw, oh, ow).transpose(1, 2, 3, 4, 0, 5, 6)
    )
    cols = cols.reshape(g, cg * kh * kw, n * oh * ow)
    wm = w.reshape(g, o // g, cg * kh * kw)
    y = xp.empty((g, o // g, n * oh * ow), x.dtype)
    for i in range(g):
        (matmul or xp.matmul)(wm[i], cols[i], out=y[i])
    return xp.ascontiguousarray(y.reshape(o, n, oh, ow).transpose(1, 0, 2, 3))


def conv2d_backward_input(xp, dy, w, attrs, matmul=None):
    """dX = col2im(Wᵀ · dY): the transposed convolution."""
    n, o, oh, ow = dy.shape
    _, cg, kh, kw = w.shape
    g = attrs["groups"]
    h, wd = attrs["size"]
    t, b, l, r = attrs["padding"]
    dym = xp.ascontiguousarray(dy.reshape(n, g, o // g, oh * ow).transpose(1, 2, 0, 3)).reshape(
        g, o // g, n * oh * ow
    )
    wm = w.reshape(g, o // g, cg * kh * kw)
    dcols = xp.empty((g, cg * kh * kw, n * oh * ow), dy.dtype)
    for i in range(g):
        (matmul or xp.matmul)(wm[i].T, dym[i], out=dcols[i])
    dcols = dcols.reshape(g * cg, kh, kw, n, oh, ow).transpose(3, 0, 1, 2, 4, 5)
    full = col2im(xp, dcols, (h + t + b, wd + l + r), attrs["stride"], attrs["dilation"])
    return xp.ascontiguousarray(_crop(full, attrs["padding"], (h, wd)))


def conv2d_backward_weight(xp, x, dy, attrs, matmul=None):
    """dW = dY · im2col(x)ᵀ per group."""
    n, c, h, wd = x.shape
    _, o, oh, ow = dy.shape
    g = attrs["groups"]
    kh, kw = attrs["size"]
    cg = c // g
    cols = windows(
        xp, padded(xp, x, attrs["padding"]), (kh, kw), attrs["stride"], attrs["dilation"], (oh, ow)
    )
    cols = xp.ascontiguousarray(
        cols.reshape(n, g, cg, kh, kw, oh, ow).transpose(1, 2, 3, 4, 0, 5, 6)
    )
    cols = cols.reshape(g, cg * kh * kw, n * oh * ow)
    dym = xp.ascontiguousarray(dy.reshape(n, g, o // g, oh * ow).transpose(1, 2, 0, 3)).reshape(
        g, o // g, n * oh * ow
    )
    dw = xp.empty((g, o // g, cg * kh * kw), x.dtype)
    for i in range(g):
        (matmul or xp.matmul)(dym[i], cols[i].T, out=dw[i])
    return dw.reshape(o, cg, kh, kw)


def _pool_windows(xp, x, attrs, value):
    k, s, p = attrs["kernel"], attrs["stride"], attrs["padding"]
    oh, ow = _spatial("pool", x.shape[2:], k, s, p)
    cols = windows(xp, padded(xp, x, p, value), k, s, (1, 1), (oh, ow))
    n, c = x.shape[:2]
    return cols.reshape(n, c, k[0] * k[1], oh, ow)


def _argmax(xp, x, attrs):
    """Index of each window's first maximum, in the window's row-major order: (N, C, 1, OH, OW)."""
    cols = _pool_windows(xp, x, attrs, -np.inf)
    return xp.expand_dims(xp.argmax(cols, axis=2), 2)


def spread_columns(xp, cols, attrs, hw):
    """cols (N, C, KH*KW, OH, OW) summed back onto an (N, C, H, W) input."""
    k, p = attrs["kernel"], attrs["padding"]
    n, c, _, oh, ow = cols.shape
    full = col2im(
        xp,
        cols.reshape(n, c, k[0], k[1], oh, ow),
        (hw[0] + p[0] + p[1], hw[1] + p[2] + p[3]),
        attrs["stride"],
        (1, 1),
    )
    return xp.ascontiguousarray(_crop(full, p, hw))


def max_pool2d(xp, x, attrs):
    return xp.max(_pool_windows(xp, x, attrs, -np.inf), axis=2)


def max_pool2d_backward(xp, x, dy, attrs):
    idx = _argmax(xp, x, attrs)
    taps = xp.arange(attrs["kernel"][0] * attrs["kernel"][1]).reshape(1, 1, -1, 1, 1)
    cols = xp.where(taps == idx, xp.expand_dims(dy, 2), xp.zeros((), dy.dtype))
    return spread_columns(xp, cols, attrs, x.shape[2:])


def max_pool2d_gather(xp, x, g, attrs):
    idx = _argmax(xp, x, attrs)
    return xp.take_along_axis(_pool_windows(xp, g, attrs, 0.0), idx, axis=2)[:, :, 0]


def avg_pool2d(xp, x, attrs):
    k = attrs["kernel"]
    return xp.sum(_pool_windows(xp, x, attrs, 0.0), axis=2) / x.dtype.type(k[0] * k[1])


def avg_pool2d_backward(xp, dy, attrs):
    k = attrs["kernel"]
    n, c, oh, ow = dy.shape
    share = xp.expand_dims(dy / dy.dtype.type(k[0] * k[1]), 2)
    cols = xp.broadcast_to(share, (n, c, k[0] * k[1], oh, ow))
    return spread_columns(xp, cols, attrs, attrs["size"])


def evaluate(op: str, xp, args, attrs, matmul=None):
    """op's result on arrays of module xp (numpy or CuPy)."""
    if op == "conv2d":
        return conv2d(xp, args[0], args[1], attrs, matmul)
    if op == "conv2dBackwardInput":
        return conv2d_backward_input(xp, args[0], args[1], attrs, matmul)
    if op == "conv2dBackwardWeight":
        return conv2d_backward_weight(xp, args[0], args[1], attrs, matmul)
    return _POOLS[op](xp, *args, attrs)


_POOLS: dict[str, Callable[..., Any]] = {
    "maxPool2d": max_pool2d,
    "maxPool2dBackward": max_pool2d_backward,
    "maxPool2dGather": max_pool2d_gather,
    "avgPool2d": avg_pool2d,
    "avgPool2dBackward": avg_pool2d_backward,
}
