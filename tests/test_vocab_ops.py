"""JAX/numpy vocabulary composed of existing ops (issue 31): activations, shape functions,
take_along_axis and the losses built on it. Each against numpy (values, through dq.jit on
cpu and interp) and float64 central differences (gradients, same targets)."""

from __future__ import annotations

import numpy as np
import pytest
from vocab_checks import TARGETS, assert_grads, assert_values

import dlvm_eq as dq

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4, 5)) + 0.05  # no entry at a kink (0) within the differences
COL = RNG.standard_normal((3, 1))


def np_log_sigmoid(x):
    return -np.logaddexp(0, -x)


# name -> (dq function of x, numpy function of x, x)
CASES = {
    "silu": (dq.silu, lambda x: x / (1 + np.exp(-x)), X),
    "nn.swish": (dq.nn.swish, lambda x: x / (1 + np.exp(-x)), X),
    "leaky_relu": (lambda x: dq.leaky_relu(x, 0.1), lambda x: np.where(x >= 0, x, 0.1 * x), X),
    "elu": (lambda x: dq.elu(x, 0.5), lambda x: np.where(x > 0, x, 0.5 * np.expm1(x)), X),
    "log_sigmoid": (dq.log_sigmoid, np_log_sigmoid, X * 20),
    "nn.softplus": (dq.nn.softplus, lambda x: np.logaddexp(0, x), X * 20),
    "relu6": (dq.relu6, lambda x: np.clip(x, 0, 6), X * 5),
    "hard_tanh": (dq.hard_tanh, lambda x: np.clip(x, -1, 1), X * 2),
    "squeeze": (lambda x: dq.squeeze(x, 1), lambda x: np.squeeze(x, 1), X[:, :1]),
    "squeeze_all": (dq.squeeze, np.squeeze, X[:1, :, :1]),
    "expand_dims": (lambda x: dq.expand_dims(x, (0, -1)), lambda x: np.expand_dims(x, (0, -1)), X),
    "broadcast_to": (
        lambda x: dq.broadcast_to(x, (2, 3, 4)),
        lambda x: np.broadcast_to(x, (2, 3, 4)),
        COL,
    ),
    "tile": (lambda x: dq.tile(x, (2, 1, 3)), lambda x: np.tile(x, (2, 1, 3)), X),
    "tile_rank_up": (lambda x: dq.tile(x, (2, 2, 1, 1)), lambda x: np.tile(x, (2, 2, 1, 1)), X),
    "repeat": (lambda x: dq.repeat(x, 2, axis=1), lambda x: np.repeat(x, 2, axis=1), X),
    "repeat_flat": (lambda x: dq.repeat(x, 3), lambda x: np.repeat(x, 3), X),
    "repeat_counts": (
        lambda x: dq.repeat(x, [1, 0, 2], axis=0),
        lambda x: np.repeat(x, [1, 0, 2], axis=0),
        X,
    ),
    "flip": (lambda x: dq.flip(x, (0, 2)), lambda x: np.flip(x, (0, 2)), X),
    "flip_all": (dq.flip, np.flip, X),
    "negative_steps": (lambda x: x[::-1, 3:0:-2, ::-3], lambda x: x[::-1, 3:0:-2, ::-3], X),
    "triu": (lambda x: dq.triu(x, 1), lambda x: np.triu(x, 1), X),
    "tril": (lambda x: dq.tril(x, -1), lambda x: np.tril(x, -1), X),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients(name, target):
    f, reference, x = CASES[name]
    want = reference(x)
    assert_values(f, (x.astype(np.float32),), want.astype(np.float32), target, rtol=2e-6)
    weights = RNG.standard_normal(np.shape(want))
    assert_grads(lambda x: dq.sum(f(x) * weights), (x,), target)


def test_eye_matches_numpy_inside_and_outside_a_trace():
    for args in ((3,), (3, 5, 1), (4, 2, -1)):
        np.testing.assert_array_equal(dq.eye(*args), np.eye(*args, dtype=np.float32))
        got = dq.jit(lambda x, a=args: x + dq.eye(*a), target="cpu")(np.zeros(np.eye(*args).shape))
        np.testing.assert_array_equal(got, np.eye(*args))


LOGITS = RNG.standard_normal((6, 5))
LABELS = np.array([0, 4, 2, 2, 1, 3], np.int32)


@pytest.mark.parametrize("target", TARGETS)
def test_take_along_axis_with_constant_and_traced_indices(target):
    idx = RNG.integers(0, 4, size=(3, 2, 5))
    want = np.take_along_axis(X, idx, axis=1)
    assert_values(lambda x: dq.take_along_axis(x, idx, axis=1), (X,), want, target, rtol=0)
    traced = dq.jit(lambda x, i: dq.take_along_axis(x, i, axis=-2), target=target)
    np.testing.assert_array_equal(traced(X, idx.astype(np.int32)), want)
    negative = idx - 4 * (RNG.random(idx.shape) < 0.5)  # numpy counts these from the end
    np.testing.assert_array_equal(traced(X, negative.astype(np.int32)), want)
    np.testing.assert_array_equal(dq.take_along_axis(X, negative, 1), want)
    weights = RNG.standard_normal(want.shape)
    assert_grads(lambda x, i: dq.sum(dq.take_along_axis(x, i, 1) * weights), (X, idx), target)


def np_log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.mark.parametrize("target", TARGETS)
def test_losses_match_their_definitions(target):
    pred, y = RNG.standard_normal((4, 3)) * 2, RNG.standard_normal((4, 3))
    d = pred - y
    cases = [
        (lambda p, t: dq.losses.mse(p, t), np.mean(d**2)),
        (lambda p, t: dq.losses.mse(p, t, reduction="sum"), np.sum(d**2)),
        (
            lambda p, t: dq.losses.huber(p, t, delta=0.7),
            np.mean(np.where(np.abs(d) <= 0.7, 0.5 * d**2, 0.7 * (np.abs(d) - 0.35))),
        ),
    ]
    for f, want in cases:
        assert_values(f, (pred, y), want, target, rtol=1e-12)
        assert_grads(f, (pred, y), target)
    logp = np_log_softmax(LOGITS)
    nll = -logp[np.arange(6), LABELS]
    assert_values(
        lambda z, t: dq.losses.nll(dq.log_softmax(z), t), (LOGITS, LABELS), nll.mean(), target
    )
    xent = dq.losses.softmax_cross_entropy_with_integer_labels
    assert_values(lambda z, t: xent(z, t), (LOGITS, LABELS), nll, target, rtol=1e-12)
    assert_grads(lambda z, t: dq.sum(xent(z, t)), (LOGITS, LABELS), target)
    # the gradient of the mean nll of log_softmax is (softmax - onehot) / n
    g = dq.jit(dq.grad(lambda z, t: dq.losses.nll(dq.log_softmax(z), t)), target=target)(
        LOGITS, LABELS
    )
    np.testing.assert_allclose(g, (np.exp(logp) - np.eye(5)[LABELS]) / 6, rtol=1e-10, atol=1e-14)


def test_shape_errors_name_the_function():
    with pytest.raises(dq.ShapeError, match="squeeze: axis 0 of shape"):
        dq.make_ir(lambda x: dq.squeeze(x, 0))(X)
    with pytest.raises(dq.ShapeError, match="broadcast_to: cannot broadcast shape"):
        dq.make_ir(lambda x: dq.broadcast_to(x, (4, 5)))(X)
    with pytest.raises(dq.ShapeError, match="take_along_axis: an index is out of range"):
        dq.make_ir(lambda x: dq.take_along_axis(x, np.full((3, 1, 5), 4), 1))(X)


def test_a_few_compositions_on_the_emulated_gpu(monkeypatch):
    """The gpu target runs them too (fake_cupy: PTX assembled by ptxas, launches on the host)."""
    import fake_cupy

    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    idx = RNG.integers(0, 3, size=(2, 1, 4)).astype(np.int32)
    with fake_cupy.installed(monkeypatch, sms=1) as cp:
        f = dq.jit(
            lambda x, i: (dq.sort(x, axis=1), dq.take_along_axis(x, i, 1), dq.tile(x[:, ::-1], 2)),
            target="gpu",
        )
        s, t, r = (a.get() for a in f(cp.asarray(x), cp.asarray(idx)))
    np.testing.assert_array_equal(s, np.sort(x, axis=1))
    np.testing.assert_array_equal(t, np.take_along_axis(x, idx, 1))
    np.testing.assert_array_equal(r, np.tile(x[:, ::-1], 2))
