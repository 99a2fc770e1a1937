"""rules/algebra.egg's `softmax` ruleset: the gradient of a softmax cross-entropy extracts to
(softmax(x) * sum(y) - y) / N, i.e. (softmax - y)/N for one-hot rows, with no division by p and
no path back through the max-subtraction (checked structurally), and computes that value."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.ad.driver import adjoint_function
from dlvm_eq.ir import Module, interpret

N, C = 4, 5


def dsl_cross_entropy(x, y):
    return dq.mean(dq.softmax_cross_entropy(x, y))


def log_of_softmax(x, y):  # as a user might write it: the log of the probabilities
    return dq.mean(-dq.sum(y * dq.log(dq.softmax(x)), axis=1))


def _gradient_program(f, x, y):
    fn = next(iter(dq.make_ir(f)(x, y).functions.values()))
    g = adjoint_function(None, fn, wrt=(0,))
    m = Module("g")
    m.add(g)
    return m, g


def _softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("loss", [dsl_cross_entropy, log_of_softmax])
def test_cross_entropy_gradient_is_softmax_minus_y_over_n(loss):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((N, C)) * 3).astype(np.float32)
    y = np.eye(C, dtype=np.float32)[[0, 3, 1, 4]]
    m, g = _gradient_program(loss, x, y)
    ops = [ins.op for ins in g.body]
    # no path back through the max: no tie mask (equal, its cast, the count of ties)
    assert "equal" not in ops and "dataTypeCast" not in ops and "max" not in ops, g
    # one max reduction (the forward shift) and one sum of exponentials; the only division is
    # by that sum, on a row vector: never by p (an N x C tensor)
    divides = [ins for ins in g.body if ins.op == "divide"]
    assert len(divides) == 1 and divides[0].result.type.shape == (N,), g
    assert ops.count("exp") == 1 and ops.count("reduce") == 3, g
    want = (_softmax(x) - y) / N
    np.testing.assert_allclose(interpret(m, g.name, x, y), want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dq.grad(loss)(x, y), want, rtol=1e-5, atol=1e-7)


def test_rows_of_y_need_not_sum_to_one():
    """(softmax * sum(y) - y)/N: the rewrite does not assume one-hot labels."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((N, C)).astype(np.float32)
    y = rng.uniform(0.0, 2.0, (N, C)).astype(np.float32)
    m, g = _gradient_program(dsl_cross_entropy, x, y)
    want = (_softmax(x) * y.sum(axis=1, keepdims=True) - y) / N
    np.testing.assert_allclose(interpret(m, g.name, x, y), want, rtol=1e-5, atol=1e-7)
