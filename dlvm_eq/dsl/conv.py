"""Convolution and pooling, as torch.nn.functional spells them (NCHW inputs, OIHW weights).

    y = dq.conv2d(x, w, stride=1, padding="same", dilation=1, groups=1)
    p = dq.max_pool2d(y, 2)                     # stride defaults to the kernel
    a = dq.avg_pool2d(y, 3, stride=1, padding=1)   # divides by 9 everywhere (count_include_pad)
    z = dq.conv1d(x1, w1, padding=1)            # NCW / OIW: conv2d on a unit axis (views, no copy)

Attributes are checked here, with messages naming the user's line; shapes by the op table.
"""

from __future__ import annotations

import numbers

from .context import shape_error
from .ops import shape_of
from .primitive import bind


def _ints(name: str, op: str, value, n: int, floor: int) -> tuple[int, ...]:
    vals = (value,) * n if isinstance(value, numbers.Integral) else value
    try:
        vals = tuple(vals)
    except TypeError:
        vals = None
    if (
        vals is None
        or len(vals) != n
        or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in vals)
    ):
        raise shape_error(f"{op}: {name} must be an int or {n} ints, got {value!r}")
    if any(v < floor for v in vals):
        raise shape_error(f"{op}: {name} {value!r} must be {'>= 0' if floor == 0 else 'positive'}")
    return tuple(int(v) for v in vals)


def _rank(op: str, x, rank: int, what: str):
    shape = shape_of(x)
    if len(shape) != rank:
        layout = (
            {4: "NCHW", 3: "NCW"}.get(rank, f"rank {rank}")
            if what == "input"
            else {4: "OIHW", 3: "OIW"}.get(rank, f"rank {rank}")
        )
        raise shape_error(f"{op}: the {what} must be {layout} (rank {rank}), got shape {shape}")
    return shape


def _conv_padding(op: str, padding, kernel, stride, dilation, n: int) -> tuple[int, ...]:
    """(lo, hi) per spatial axis, flattened; 'same' pads d(k-1) with the extra one after, as torch."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0,) * (2 * n)
        if padding == "same":
            if any(s != 1 for s in stride):
                raise shape_error(
                    f"{op}: padding='same' needs stride 1 (as torch), got stride {stride}"
                )
            out = []
            for k, d in zip(kernel, dilation):
                total = d * (k - 1)
                out += [total // 2, total - total // 2]
            return tuple(out)
        raise shape_error(
            f"{op}: padding must be an int, {n} ints, 'same' or 'valid', got {padding!r}"
        )
    pads = _ints("padding", op, padding, n, 0)
    return tuple(p for p in pads for _ in (0, 1))


def conv2d(x, w, stride=1, padding=0, dilation=1, groups=1):
    """2-D cross-correlation of x (N, C, H, W) with w (O, C/groups, KH, KW), as torch's conv2d."""
    op = "conv2d"
    _rank(op, x, 4, "input")
    ws = _rank(op, w, 4, "weight")
    stride, dilation = _ints("stride", op, stride, 2, 1), _ints("dilation", op, dilation, 2, 1)
    (groups,) = _ints("groups", op, groups, 1, 1)
    pad = _conv_padding(op, padding, ws[2:], stride, dilation, 2)
    return bind(
        "conv2d",
        [x, w],
        name=op,
        float_result=True,
        stride=stride,
        padding=pad,
        dilation=dilation,
        groups=groups,
    )


def conv1d(x, w, stride=1, padding=0, dilation=1, groups=1):
    """1-D cross-correlation of x (N, C, L) with w (O, C/groups, K): conv2d over a unit height."""
    op = "conv1d"
    _rank(op, x, 3, "input")
    ws = _rank(op, w, 3, "weight")
    (s,), (d,) = _ints("stride", op, stride, 1, 1), _ints("dilation", op, dilation, 1, 1)
    (groups,) = _ints("groups", op, groups, 1, 1)
    lo, hi = _conv_padding(op, padding, ws[2:], (s,), (d,), 1)
    x4, w4 = bind("padShape", [x], name=op, at=2), bind("padShape", [w], name=op, at=2)
    y = bind(
        "conv2d",
        [x4, w4],
        name=op,
        float_result=True,
        stride=(1, s),
        padding=(0, 0, lo, hi),
        dilation=(1, d),
        groups=groups,
    )
    return bind("squeezeShape", [y], name=op, at=2)


def _pool(op: str, ir_op: str, x, kernel, stride, padding):
    _rank(op, x, 4, "input")
    kernel = _ints("kernel", op, kernel, 2, 1)
    stride = kernel if stride is None else _ints("stride", op, stride, 2, 1)
    pads = _ints("padding", op, padding, 2, 0)
    return bind(
        ir_op,
        [x],
        name=op,
        float_result=True,
        kernel=kernel,
        stride=stride,
        padding=(pads[0], pads[0], pads[1], pads[1]),
    )


def max_pool2d(x, kernel, stride=None, padding=0):
    """Maximum of each kernel window of x (N, C, H, W), padding with -inf; stride defaults to kernel."""
    return _pool("max_pool2d", "maxPool2d", x, kernel, stride, padding)


def avg_pool2d(x, kernel, stride=None, padding=0):
    """Mean of each kernel window of x (N, C, H, W), zero padding counted (torch's count_include_pad)."""
    return _pool("avg_pool2d", "avgPool2d", x, kernel, stride, padding)


def conv_transpose2d(x, w, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """torch's conv_transpose2d: x (N, C_in, H, W), w (C_in, C_out/groups, KH, KW); the input
    adjoint of conv2d with that weight (IR `conv2dBackwardInput`), so its own adjoints are a
    conv2d and a conv2dBackwardWeight. Output size (H - 1) s - 2 p + d (KH - 1) + op + 1."""
    op = "conv_transpose2d"
    xs = _rank(op, x, 4, "input")
    ws = _rank(op, w, 4, "weight")
    stride, dilation = _ints("stride", op, stride, 2, 1), _ints("dilation", op, dilation, 2, 1)
    pad = _ints("padding", op, padding, 2, 0)
    extra = _ints("output_padding", op, output_padding, 2, 0)
    (groups,) = _ints("groups", op, groups, 1, 1)
    if any(e >= max(s, d) for e, s, d in zip(extra, stride, dilation)):
        raise shape_error(
            f"{op}: output_padding {extra} must be smaller than the stride or the dilation"
        )
    size = tuple(
        (n - 1) * s - 2 * p + d * (k - 1) + e + 1
        for n, s, p, d, k, e in zip(xs[2:], stride, pad, dilation, ws[2:], extra)
    )
    if min(size) < 1:
        raise shape_error(f"{op}: the output would have spatial size {size}")
    return bind(
        "conv2dBackwardInput",
        [x, w],
        name=op,
        float_result=True,
        stride=stride,
        padding=(pad[0], pad[0], pad[1], pad[1]),
        dilation=dilation,
        groups=groups,
        size=size,
    )
