"""Layers added for issue 31: batch_norm (training and evaluation modes, running statistics in
a pytree), group_norm, conv_transpose2d (conv2d's input adjoint, exposed) and upsampling
(nearest, bilinear) against numpy written from torch's definitions; gradients against float64
central differences, through dq.jit on cpu and interp."""

from __future__ import annotations

import numpy as np
import pytest
from vocab_checks import TARGETS, assert_grads, assert_values

import dlvm_eq as dq

RNG = np.random.default_rng(11)


def np_batch_norm(x, mean, var, w, b, eps=1e-5):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * w.reshape(
        shape
    ) + b.reshape(shape)


@pytest.mark.parametrize("target", TARGETS)
def test_batch_norm_training_then_evaluation(target):
    x = RNG.standard_normal((4, 3, 5, 2)) * 2 + 1
    w, b = RNG.standard_normal(3), RNG.standard_normal(3)
    state = dq.nn.batch_norm_state(3, "f64")
    step = dq.jit(
        lambda x, s, w, b: dq.nn.batch_norm(x, s, w, b, training=True, momentum=0.2), target=target
    )
    y, new = step(x, state, w, b)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    np.testing.assert_allclose(y, np_batch_norm(x, mean, var, w, b), rtol=1e-10, atol=1e-12)
    assert isinstance(new, dq.BatchNormState)
    np.testing.assert_allclose(new.mean, 0.2 * mean, rtol=1e-12)
    n = x.size / 3
    np.testing.assert_allclose(new.var, 0.8 + 0.2 * var * n / (n - 1), rtol=1e-12)
    evaluate = dq.jit(
        lambda x, s, w, b: dq.nn.batch_norm(x, s, w, b, training=False), target=target
    )
    y_eval, same = evaluate(x, new, w, b)
    np.testing.assert_allclose(y_eval, np_batch_norm(x, new.mean, new.var, w, b), rtol=1e-10)
    np.testing.assert_array_equal(same.var, new.var)

    def loss(x, w, b):
        y, _ = dq.nn.batch_norm(x, state, w, b, training=True)
        return dq.sum(dq.tanh(y) * weights)

    weights = RNG.standard_normal(x.shape)
    assert_grads(loss, (x, w, b), target)


@pytest.mark.parametrize("target", TARGETS)
def test_batch_norm_on_features_and_group_norm(target):
    x = RNG.standard_normal((6, 4))
    state = dq.batch_norm_state(4, "f64")
    y, _ = dq.jit(lambda x, s: dq.batch_norm(x, s), target=target)(x, state)
    np.testing.assert_allclose(y, (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5), rtol=1e-10)
    img = RNG.standard_normal((2, 6, 3, 3))
    w, b = RNG.standard_normal(6), RNG.standard_normal(6)
    g = img.reshape(2, 3, -1)
    want = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(
        img.shape
    )
    want = want * w.reshape(1, 6, 1, 1) + b.reshape(1, 6, 1, 1)
    assert_values(
        lambda x, w, b: dq.nn.group_norm(x, 3, w, b), (img, w, b), want, target, rtol=1e-10
    )
    weights = RNG.standard_normal(img.shape)
    assert_grads(
        lambda x, w, b: dq.sum(dq.nn.group_norm(x, 3, w, b) * weights), (img, w, b), target
    )


def np_conv_transpose2d(x, w, stride, padding, output_padding, dilation, groups):
    """torch's definition: every input pixel scatters its weighted kernel into the output."""
    n, cin, h, wd = x.shape
    _, cout_g, kh, kw = w.shape
    (s0, s1), (p0, p1), (o0, o1), (d0, d1) = stride, padding, output_padding, dilation
    oh = (h - 1) * s0 - 2 * p0 + d0 * (kh - 1) + o0 + 1
    ow = (wd - 1) * s1 - 2 * p1 + d1 * (kw - 1) + o1 + 1
    out = np.zeros((n, cout_g * groups, oh + 2 * p0 + kh * d0, ow + 2 * p1 + kw * d1))
    cin_g = cin // groups
    for ci in range(cin):
        g = ci // cin_g
        for i in range(h):
            for j in range(wd):
                for a in range(kh):
                    for c in range(kw):
                        rows = slice(g * cout_g, (g + 1) * cout_g)
                        out[:, rows, i * s0 + a * d0, j * s1 + c * d1] += (
                            x[:, ci, i, j, None] * w[ci, :, a, c]
                        )
    return out[:, :, p0 : p0 + oh, p1 : p1 + ow]


CONV_T = {
    "plain": dict(stride=1, padding=0, output_padding=0, dilation=1, groups=1),
    "stride2_pad1_out1": dict(stride=2, padding=1, output_padding=1, dilation=1, groups=1),
    "dilated_grouped": dict(stride=(2, 1), padding=(0, 1), output_padding=0, dilation=2, groups=2),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(CONV_T))
def test_conv_transpose2d_matches_torchs_definition(case, target):
    kw = CONV_T[case]
    x, w = RNG.standard_normal((2, 4, 3, 4)), RNG.standard_normal((4, 3, 3, 2))
    pairs = {k: (v, v) if isinstance(v, int) else v for k, v in kw.items() if k != "groups"}
    want = np_conv_transpose2d(x, w, **pairs, groups=kw["groups"])
    f = lambda x, w: dq.conv_transpose2d(x, w, **kw)
    assert_values(f, (x, w), want, target, rtol=1e-10, atol=1e-12)
    weights = RNG.standard_normal(want.shape)
    assert_grads(lambda x, w: dq.sum(f(x, w) * weights), (x, w), target)


def test_conv_transpose2d_is_the_adjoint_of_conv2d():
    x, w = RNG.standard_normal((1, 3, 7, 6)), RNG.standard_normal((4, 3, 3, 3))
    y = dq.jit(lambda x, w: dq.conv2d(x, w, stride=2, padding=1))(x, w)
    dy = RNG.standard_normal(y.shape)
    # width 6 -> 3 -> 5 + output_padding 1: torch's way to pick among the sizes that map to 3
    back = dq.jit(lambda dy, w: dq.conv_transpose2d(dy, w, 2, 1, output_padding=(0, 1)))(dy, w)
    assert back.shape == x.shape
    np.testing.assert_allclose(np.sum(back * x), np.sum(dy * y), rtol=1e-10)


def np_bilinear(x, sh, sw):
    """torch's interpolate(mode="bilinear", align_corners=False), pixel by pixel."""
    n, c, h, w = x.shape
    out = np.empty((n, c, h * sh, w * sw))

    def source(o, f, size):
        s = max((o + 0.5) / f - 0.5, 0.0)
        i0 = min(int(s), size - 1)
        return i0, min(i0 + 1, size - 1), s - i0

    for oi in range(h * sh):
        a0, a1, fa = source(oi, sh, h)
        for oj in range(w * sw):
            b0, b1, fb = source(oj, sw, w)
            top = x[:, :, a0, b0] * (1 - fb) + x[:, :, a0, b1] * fb
            bottom = x[:, :, a1, b0] * (1 - fb) + x[:, :, a1, b1] * fb
            out[:, :, oi, oj] = top * (1 - fa) + bottom * fa
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_upsampling_nearest_and_bilinear(target):
    x = RNG.standard_normal((2, 3, 4, 5))
    nearest = np.repeat(np.repeat(x, 2, axis=2), 3, axis=3)
    assert_values(lambda x: dq.upsample(x, (2, 3)), (x,), nearest, target, rtol=0, atol=0)
    assert_values(
        lambda x: dq.upsample(x, (2, 3), mode="bilinear"),
        (x,),
        np_bilinear(x, 2, 3),
        target,
        rtol=1e-12,
    )
    ramp = np.array([[[[0.0, 1.0]]]])
    got = dq.jit(lambda x: dq.upsample(x, (1, 2), mode="bilinear"), target=target)(ramp)
    np.testing.assert_allclose(got[0, 0, 0], [0.0, 0.25, 0.75, 1.0])  # torch's values
    for mode in ("nearest", "bilinear"):
        weights = RNG.standard_normal(nearest.shape)
        assert_grads(
            lambda x, m=mode: dq.sum(dq.upsample(x, (2, 3), mode=m) * weights), (x,), target
        )
