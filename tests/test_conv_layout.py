"""rules/layout.egg's convolution forms: a 1x1 convolution (stride 1, no padding, one group) and
its two adjoints get a batched-product form over the (N, C, H*W) view of the NCHW activation; a
depthwise 3x3 one (stride 1, padding 1) and its adjoints nine shifted multiply-adds. Each rule
fires where it should and not where it must not (the e-graph alone), and random programs of
convolutions, maps and reductions agree after optimization with PyTorch in float64 (the value)
and the reference interpreter (the gradient)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from layout_checks import declarations, equal_after
from layout_checks import vec as _vec

import dlvm_eq as dq

SHAPES = {
    "X": (2, 3, 5, 5),  # an NCHW activation
    "P": (4, 3, 1, 1),  # pointwise weights
    "Q": (4, 3, 3, 3),  # 3x3 weights
    "G": (3, 1, 1, 1),  # per-channel (grouped) 1x1 weights
    "DY": (2, 4, 5, 5),  # a gradient of the pointwise conv's result
    "D": (3, 1, 3, 3),  # depthwise 3x3 weights of X
    "E": (4, 1, 3, 3),  # depthwise 3x3 weights of DY
    "H": (4, 2, 3, 3),  # 3x3 weights of DY in groups of 2 channels
}


def _equal_after(term: str, expected: str) -> bool:
    return equal_after(declarations({n: (s, "f32") for n, s in SHAPES.items()}), term, expected, 4)


def _attrs(stride=1, pad=0, groups=1, size=()) -> str:
    return _vec(stride, stride, pad, pad, pad, pad, 1, 1, groups, *size)


def _forward(x="$X", w="$P", o=4, k=3) -> str:
    return (
        f"(ShapeCast (BatchMatmul (Broadcast (ShapeCast {w} {_vec(1, o, k)}) {_vec(2, o, k)})"
        f" (ShapeCast {x} {_vec(2, k, 25)})) {_vec(2, o, 5, 5)})"
    )


INPUT_ADJOINT = (
    f"(ShapeCast (BatchMatmul (Broadcast (Transpose (ShapeCast $P {_vec(1, 4, 3)}) {_vec(0, 2, 1)})"
    f" {_vec(2, 3, 4)}) (ShapeCast $DY {_vec(2, 4, 25)})) {_vec(2, 3, 5, 5)})"
)
WEIGHT_ADJOINT = (
    f"(ShapeCast (Reduce (BatchMatmul (ShapeCast $DY {_vec(2, 4, 25)})"
    f' (Transpose (ShapeCast $X {_vec(2, 3, 25)}) {_vec(0, 2, 1)})) "add" 0.0 0) {_vec(4, 3, 1, 1)})'
)

FIRES = [
    ("conv1x1-product", f"(Conv2d $X $P {_attrs()})", _forward()),
    (
        "conv1x1-input-adjoint-product",
        f"(Conv2dBackwardInput $DY $P {_attrs(size=(5, 5))})",
        INPUT_ADJOINT,
    ),
    (
        "conv1x1-weight-adjoint-product",
        f"(Conv2dBackwardWeight $X $DY {_attrs(size=(1, 1))})",
        WEIGHT_ADJOINT,
    ),
    # the depthwise forms: a sum of taps (no convolution's class holds an Add otherwise),
    # the weight adjoint's taps concatenated along the kernel rows
    ("depthwise3x3-taps", f"(Conv2d $X $D {_attrs(pad=1, groups=3)})", "(Add ?a ?b)"),
    (
        "depthwise3x3-input-adjoint-taps",
        f"(Conv2dBackwardInput $DY $E {_attrs(pad=1, groups=4, size=(5, 5))})",
        "(Add ?a ?b)",
    ),
    (
        "depthwise3x3-weight-adjoint-taps",
        f"(Conv2dBackwardWeight $X $X {_attrs(pad=1, groups=3, size=(3, 3))})",
        "(Concatenate ?a ?b 2)",
    ),
]


@pytest.mark.parametrize("name,term,expected", FIRES, ids=[f[0] for f in FIRES])
def test_pointwise_conv_rule_fires(name, term, expected):
    assert _equal_after(term, expected)


HOLDS = [
    # a 3x3 window is no product of the activation itself
    ("3x3", f"(Conv2d $X $Q {_attrs(pad=1)})", _forward(w="$Q")),
    # stride 2 reads every other pixel: the (N, C, H*W) view is the wrong matrix
    ("stride", f"(Conv2d $X $P {_attrs(stride=2)})", _forward()),
    # padding adds a zero border the product would not have
    ("padding", f"(Conv2d $X $P {_attrs(pad=1)})", _forward()),
    # groups: each output channel reads its own group's channels only
    ("groups", f"(Conv2d $X $G {_attrs(groups=3)})", _forward(w="$G", o=3, k=1)),
    (
        "adjoint-groups",
        f"(Conv2dBackwardWeight $X $DY {_attrs(groups=3, size=(1, 1))})",
        WEIGHT_ADJOINT,
    ),
    (
        "adjoint-3x3",
        f"(Conv2dBackwardWeight $X $DY {_attrs(pad=1, size=(3, 3))})",
        WEIGHT_ADJOINT,
    ),
    # depthwise: stride 2, no padding, and groups of two channels keep their convolution
    ("dw-stride", f"(Conv2d $X $D {_attrs(stride=2, pad=1, groups=3)})", "(Add ?a ?b)"),
    ("dw-no-padding", f"(Conv2d $X $D {_attrs(groups=3)})", "(Add ?a ?b)"),
    (
        "dw-two-channels-a-group",
        f"(Conv2dBackwardInput $DY $H {_attrs(pad=1, groups=2, size=(5, 5))})",
        "(Add ?a ?b)",
    ),
    (
        "dw-weight-stride",
        f"(Conv2dBackwardWeight $X $X {_attrs(stride=2, pad=1, groups=3, size=(3, 3))})",
        "(Concatenate ?a ?b 2)",
    ),
]


@pytest.mark.parametrize("name,term,unexpected", HOLDS, ids=[h[0] for h in HOLDS])
def test_pointwise_conv_rule_guard_holds(name, term, unexpected):
    assert not _equal_after(term, unexpected)


# ---------------------------------------------------------------- whole programs


def _torch_conv(x, w, stride=1, padding=0, groups=1):
    import torch

    return torch.nn.functional.conv2d(
        torch.from_numpy(x), torch.from_numpy(w), stride=stride, padding=padding, groups=groups
    ).numpy()


def _dq_conv(x, w, stride=1, padding=0, groups=1):
    return dq.conv2d(x, w, stride=stride, padding=padding, groups=groups)


MAPS = ("relu", "tanh", "sin")


def _map(F, name, h):
    if name == "relu":
        return F.maximum(h, 0.0) if F is np else dq.relu(h)
    return getattr(F, name)(h)


def _program(layers, end, F, conv, x, ws, b):
    """Convolutions `layers` (kind, map) over x; kinds: "pw" (1x1), "dw" (3x3 depthwise,
    padding 1), "full" (3x3, padding 1), "s2" (1x1, stride 2); then the loss `end`."""
    h = x
    for (kind, mapname), w in zip(layers, ws):
        if kind == "dw":
            h = conv(h, w, padding=1, groups=h.shape[1])
        elif kind == "full":
            h = conv(h, w, padding=1)
        else:
            h = conv(h, w, stride=2 if kind == "s2" else 1)
        h = _map(F, mapname, h + F.reshape(b[: h.shape[1]], (1, -1, 1, 1)))
    if end == "chansum":  # per-channel sums, as a bias gradient reads them
        return F.sum(F.sum(F.sum(h, axis=0), axis=(1, 2)) ** 2)
    if end == "max":
        return F.sum(F.max(h, axis=3) ** 2)
    return F.sum(h * h)


CHANNELS = 4


def _weights(layers, rng):
    ws = []
    for kind, _ in layers:
        shape = {"dw": (CHANNELS, 1, 3, 3), "full": (CHANNELS, CHANNELS, 3, 3)}.get(
            kind, (CHANNELS, CHANNELS, 1, 1)
        )
        ws.append(rng.standard_normal(shape) * (np.prod(shape[1:]) ** -0.5))
    return ws


SETTINGS = dict(
    deadline=None,
    derandomize=True,
    max_examples=15,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LAYER = st.tuples(st.sampled_from(("pw", "pw", "dw", "full", "s2")), st.sampled_from(MAPS))


@settings(**SETTINGS)
@given(
    st.lists(LAYER, min_size=1, max_size=3),
    st.sampled_from(("square", "chansum", "max")),
    st.integers(0, 2**16),
)
def test_random_conv_programs_agree_after_the_layout_rules(layers, end, seed):
    pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, CHANNELS, 6, 6)) * 0.5
    ws = _weights(layers, rng)
    b = rng.standard_normal(CHANNELS) * 0.1
    want = _program(layers, end, np, _torch_conv, x, ws, b)

    def loss(x, b, *ws):
        return _program(layers, end, dq, _dq_conv, x, ws, b)

    got = float(dq.jit(loss)(x, b, *ws))  # float64 throughout
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * abs(want))
    argnums = tuple(range(2 + len(ws)))
    grads = dq.jit(dq.grad(loss, argnums=argnums))(x, b, *ws)
    refs = dq.jit(dq.grad(loss, argnums=argnums), target="interp")(x, b, *ws)
    for g, r in zip(grads, refs):
        r = np.asarray(r)
        np.testing.assert_allclose(np.asarray(g), r, rtol=1e-8, atol=1e-9 * np.abs(r).max())


def _pointwise_step(d, w, b, x):
    h = dq.relu(dq.conv2d(dq.conv2d(x, d, padding=1, groups=16), w) + dq.reshape(b, (1, -1, 1, 1)))
    return dq.sum(h * h)


def _arrays():
    rng = np.random.default_rng(1)
    d = (rng.standard_normal((16, 1, 3, 3)) / 3).astype(np.float32)
    w = (rng.standard_normal((16, 16, 1, 1)) * 0.25).astype(np.float32)
    return d, w, np.zeros(16, np.float32), rng.standard_normal((4, 16, 8, 8)).astype(np.float32)


def test_pointwise_conv_is_extracted_as_a_product_and_reported():
    """The depthwise-separable block: the pointwise convolution is extracted as a batched
    product (the default cost model prices it below im2col + the layout copy), the depthwise
    one as nine shifted multiply-adds (below C one-row products and a column matrix of C*9
    rows), and the report says so with the predicted seconds."""
    args = _arrays()
    result = dq.optimize(dq.jit(_pointwise_step).lower(*args))
    (fn,) = result.module.functions.values()
    ops = [i.op for i in fn.body]
    assert ops.count("batchMatmul") == 1 and ops.count("conv2d") == 0
    assert ops.count("sliceScatter") == 1  # the depthwise input's zero rows
    (line,) = [ln for f in result.report for ln in f.layout if "convolutions" in ln]
    assert line.startswith(
        "layout: convolutions 2 -> 0 (1 pointwise as batched products, 1 depthwise as shifted"
    )
    assert "conv1x1-product x1" in str(result.report)
    assert "depthwise3x3-taps x1" in str(result.report)


def test_pointwise_adjoints_are_extracted_as_products():
    """The gradient of the same block, differentiated in the e-graph with the algebra on (as
    benchmarks/egraph_value.py builds it): no convolution is left (the pointwise ones are
    batched products, the depthwise ones multiply-adds), and the program still agrees with
    the interpreter."""
    from dlvm_eq.ad import adjoint_function
    from dlvm_eq.ir.module import Module

    args = _arrays()
    forward = dq.make_ir(_pointwise_step, name="block")(*args)["block"]
    grad = adjoint_function(None, forward, wrt=(0, 1, 2), keeping=(0,), tuple_result=True)
    module = Module(grad.name)
    module.add(grad)
    result = dq.optimize(module, grad.name)
    (fn,) = result.module.functions.values()
    ops = [i.op for i in fn.body]
    assert ops.count("batchMatmul") >= 2
    assert not {"conv2d", "conv2dBackwardInput"} & set(ops)
    want = dq.interpret(module, grad.name, *args)
    got = dq.compile(result.module, grad.name, target="cpu", optimize=False)(*args)
    for g, r in zip(got, want):
        r = np.asarray(r, np.float64)
        np.testing.assert_allclose(np.asarray(g), r, rtol=1e-4, atol=1e-5 * np.abs(r).max())


def test_pointwise_weight_adjoint_is_a_product_once_the_layout_copy_is_priced():
    """dW = sum_n dy[n] x[n]^T: a batched product and a sum over the images, against im2col,
    the transposing copy of dY and one product (extract/window_cost.py prices that copy); at
    64 channels the product form is extracted (measured 0.25 against 0.39-0.59 ms at
    8x64x16x16, load 1-9)."""
    from dlvm_eq.ad import adjoint_function
    from dlvm_eq.ir.module import Module

    def loss(w, x, g):
        return dq.sum(dq.conv2d(x, w) * g)

    rng = np.random.default_rng(3)
    args = (
        rng.standard_normal((64, 64, 1, 1)).astype(np.float32),
        rng.standard_normal((8, 64, 16, 16)).astype(np.float32),
        rng.standard_normal((8, 64, 16, 16)).astype(np.float32),
    )
    forward = dq.make_ir(loss, name="pw")(*args)["pw"]
    grad = adjoint_function(None, forward, wrt=(0, 1), keeping=(0,), tuple_result=True)
    module = Module(grad.name)
    module.add(grad)
    (fn,) = dq.optimize(module, grad.name).module.functions.values()
    ops = [i.op for i in fn.body]
    assert ops.count("batchMatmul") == 3 and not any(op.startswith("conv2d") for op in ops)
