"""The convolutions' work under any blocks (issue 36): `conv_blocks.conv_work` says which products
and transposing copies conv_cpu runs, and the cost model prices exactly that
(calibration/plan_cost.window_work), so blocks and their alternatives are priced, not fixed.

Oracles: the products and copies conv_cpu really makes (spied, for random shapes and blocks),
and PyTorch in float64 for the results. Results under any blocks are held to Higham's bound for
any order of a float32 sum of K terms: |got - exact| <= gamma_K * (sum of |terms|), gamma_K =
K u / (1 - K u), u = 2**-24, with K the terms per result element plus the chunk additions. Not
bit for bit: OpenBLAS picks its kernel by a product's shape, and a chunk's column count changes
the shape, so the order of a sum can change with the blocks even where our loops do not.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlvm_eq.calibration import plan_cost
from dlvm_eq.codegen.runtime import conv_blocks, conv_cpu
from dlvm_eq.extract.machine import MACHINES
from dlvm_eq.ir import window_ops

OPS = conv_cpu.OPS


def _matmul(a, b, out):
    np.matmul(a, b, out=out)


def _operands(op, x, w, dy):
    return {"conv2d": (x, w), "conv2dBackwardInput": (dy, w), "conv2dBackwardWeight": (x, dy)}[op]


def _attrs(op, attrs, x, w):
    return {
        "conv2d": attrs,
        "conv2dBackwardInput": {**attrs, "size": x.shape[2:]},
        "conv2dBackwardWeight": {**attrs, "size": w.shape[2:]},
    }[op]


def _case(n, c_per_group, groups, o_per_group, hw, k, pad):
    rng = np.random.default_rng(n * 1000 + c_per_group * 100 + hw)
    c, o = c_per_group * groups, o_per_group * groups
    x = rng.standard_normal((n, c, hw, hw), dtype=np.float32)
    w = rng.standard_normal((o, c_per_group, k, k), dtype=np.float32)
    attrs = dict(stride=(1, 1), padding=(pad,) * 4, dilation=(1, 1), groups=groups)
    oh = hw + 2 * pad - k + 1
    dy = rng.standard_normal((n, o, oh, oh), dtype=np.float32)
    return x, w, dy, attrs


def _is_transposed(m: np.ndarray) -> bool | None:
    """Whether a product operand is a transposed view (None: a dimension of 1 says nothing)."""
    if m.shape[-1] == 1 or m.shape[-2] == 1:
        return None
    return m.strides[-1] != m.itemsize


class _Spy:
    """Records every product (np.matmul, per image stacked) and transposing copy conv_cpu makes."""

    def __init__(self, monkeypatch):
        self.products: Counter = Counter()
        self.flags: list = []
        self.copy_bytes = 0
        real_matmul, real_copy = np.matmul, conv_cpu._copy_blocks

        def matmul(a, b, out=None, **kw):
            count = int(np.prod(b.shape[:-2])) if b.ndim > 2 else 1
            self.products[(a.shape[-2], a.shape[-1], b.shape[-1], count)] += 1
            self.flags.append((_is_transposed(a), _is_transposed(b), a.shape, b.shape))
            return real_matmul(a, b, out=out, **kw)

        def copy(dst, src):
            self.copy_bytes += 2 * dst.nbytes
            real_copy(dst, src)

        monkeypatch.setattr(np, "matmul", matmul)
        monkeypatch.setattr(conv_cpu, "_copy_blocks", copy)


def _predicted(op, x, w, dy, attrs, blocks):
    shapes = (a.shape for a in _operands(op, x, w, dy))
    g = conv_cpu.geometry_for(op, *shapes, x.dtype, _attrs(op, attrs, x, w))
    o = w.shape[0]
    return conv_blocks.conv_work(op, x.shape[0], g.rows, g.cols, o, attrs["groups"], 4, blocks)


SHAPES = st.tuples(
    st.integers(1, 5),  # images
    st.integers(1, 4),  # channels per group
    st.sampled_from([1, 2]),  # groups
    st.integers(1, 4),  # output channels per group
    st.integers(3, 7),  # height = width
    st.sampled_from([1, 3]),  # kernel
    st.sampled_from([0, 1]),  # padding
)
BLOCKS = st.fixed_dictionaries(
    {
        "chunk_bytes": st.sampled_from([1 << 10, 1 << 12, 1 << 14, 64 << 20]),
        "per_image_macs": st.sampled_from([1, 1 << 10, 1 << 30]),
    }
)


@pytest.fixture
def shipped_blocks_after():
    yield
    conv_blocks.use_blocks(None)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=SHAPES, blocks=BLOCKS, op=st.sampled_from(OPS))
def test_the_priced_work_is_what_the_convolution_runs(shape, blocks, op, shipped_blocks_after):
    x, w, dy, attrs = _case(*shape)
    want = _predicted(op, x, w, dy, attrs, blocks)
    conv_blocks.use_blocks(blocks)
    assert _predicted(op, x, w, dy, attrs, None) == want  # None: the blocks in use
    with pytest.MonkeyPatch.context() as mp:
        spy = _Spy(mp)
        conv_cpu.evaluate(op, _operands(op, x, w, dy), _attrs(op, attrs, x, w), _matmul)
    ran = Counter()
    for m, k, n, count in spy.products.elements():
        ran[(m, k, n)] += count
    priced = Counter()
    for m, k, n, _, _, count in want.products:
        priced[(m, k, n)] += count
    assert ran == priced
    layouts = {(ta, tb) for m, k, n, ta, tb, _ in want.products}
    assert len(layouts) == 1
    (ta, tb) = layouts.pop()
    for got_a, got_b, _, _ in spy.flags:
        assert got_a in (None, ta) and got_b in (None, tb)
    per_image = want.strategy == "one product per image"
    parts = x.shape[0] * w.shape[0] * w[0].size * 4 if op == "conv2dBackwardWeight" else 0
    assert spy.copy_bytes == (want.copy_bytes - parts if per_image else want.copy_bytes)


def _torch(op, x, w, dy, attrs, absolute=False):
    import torch

    if absolute:
        x, w, dy = np.abs(x), np.abs(w), np.abs(dy)
    x, w, dy = (torch.from_numpy(a.astype(np.float64)).requires_grad_() for a in (x, w, dy))
    y = torch.nn.functional.conv2d(x, w, padding=attrs["padding"][0], groups=attrs["groups"])
    if op == "conv2d":
        return y.detach().numpy()
    (y * dy).sum().backward()
    return (x if op == "conv2dBackwardInput" else w).grad.numpy()


def _terms(op, x, w, dy, groups):
    """Terms summed into one result element (an upper bound): the forward C/g·KH·KW, the input
    adjoint O/g·KH·KW, the weight adjoint every image's positions (plus one per chunk)."""
    kk = w.shape[2] * w.shape[3]
    return {
        "conv2d": x.shape[1] // groups * kk,
        "conv2dBackwardInput": w.shape[0] // groups * kk,
        "conv2dBackwardWeight": 2 * x.shape[0] * dy.shape[2] * dy.shape[3],
    }[op]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=SHAPES, a=BLOCKS, b=BLOCKS)
def test_results_do_not_depend_on_the_blocks(shape, a, b, shipped_blocks_after):
    pytest.importorskip("torch")
    x, w, dy, attrs = _case(*shape)
    groups = attrs["groups"]
    for op in OPS:
        got = []
        for blocks in (a, b):
            conv_blocks.use_blocks(blocks)
            args = _operands(op, x, w, dy)
            got.append(conv_cpu.evaluate(op, args, _attrs(op, attrs, x, w), _matmul))
        # Not bit-identical across chunkings: OpenBLAS picks its kernel by the product's shape
        # (its small-matrix path on SkylakeX), and a chunk's column count changes the shape, so
        # the order of a sum can change too (seen: shape (2, 4, 1, 2, 3, 3, 1), chunks of 1024
        # and 4096 bytes, 1 ulp apart). Each result is held to the float32 bound instead.
        exact = _torch(op, x, w, dy, attrs)
        k = _terms(op, x, w, dy, groups)
        u = 2.0**-24
        bound = k * u / (1 - k * u) * _torch(op, x, w, dy, attrs, absolute=True) + 1e-30
        for r in got:
            assert np.all(np.abs(r - exact) <= bound), op


def test_pricing_follows_the_blocks():
    """The CNN's second layer (128 x 32 x 14 x 14, 64 filters): one product per image is
    priced as 128 products with no copy, chunks as one product per chunk plus the copy; and
    window_work prices the alternatives it is given, not only the blocks in use."""
    packed = window_ops.pack(
        "conv2d", dict(stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)
    )
    ins, out = [(128, 32, 14, 14), (64, 32, 3, 3)], (128, 64, 14, 14)
    mc = MACHINES["cpu"]
    one = {"chunk_bytes": 64 << 20, "per_image_macs": 1 << 30}
    per = {"chunk_bytes": 64 << 20, "per_image_macs": 1}
    small = {"chunk_bytes": 4 << 20, "per_image_macs": 1}
    b1, p1 = plan_cost.window_work("conv2d", packed, ins, out, 4, one)
    b2, p2 = plan_cost.window_work("conv2d", packed, ins, out, 4, per)
    b3, p3 = plan_cost.window_work("conv2d", packed, ins, out, 4, small)
    assert p1 == [(64, 288, 196, False, False, 128)]
    assert p2 == [(64, 288, 128 * 196, False, False, 1)]
    assert p3 == [(64, 288, 18 * 196, False, False, 7), (64, 288, 2 * 196, False, False, 1)]
    assert b2 == b3 == b1 + 2 * 128 * 64 * 196 * 4
    times = [plan_cost.window_products_seconds(mc, p) for p in (p1, p2, p3)]
    assert len(set(times)) == 3
