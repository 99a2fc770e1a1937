"""A NaN in a max/min reduction (issue 31, bug 3): the result of its row is NaN, and the row's
adjoint goes to its NaNs, shared equally (torch's max()/min() rule), not 0 as before; rows
without a NaN keep the tie rule (equal shares among the elements equal to the result)."""

from __future__ import annotations

import numpy as np
import pytest
from vocab_checks import TARGETS

import dlvm_eq as dq

X = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 5.0], [np.nan, 0.0, np.nan]], np.float32)
W = np.array([1.0, 2.0, 3.0], np.float32)


def reference(x, w, reduce, axis):
    """torch's rule spelled out: per row, the NaNs share g if there are any, else the
    elements equal to the result do."""
    x = np.moveaxis(x, axis, -1)
    out = np.zeros_like(x)
    for i, row in enumerate(x):
        hit = np.isnan(row) if np.isnan(row).any() else row == reduce(row)
        out[i] = hit * (w[i] / hit.sum())
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("name", ["max", "min"])
def test_nan_rows_route_their_gradient_to_the_nans(name, axis, target):
    reduce = getattr(dq, name)

    def f(x):
        return dq.sum(reduce(x, axis=axis) * W)

    got = dq.jit(dq.grad(f), target=target)(X)
    want = reference(X, W, getattr(np, name), axis)
    np.testing.assert_array_equal(got, want)
    assert got.sum() == pytest.approx(W.sum())  # nothing lost: every row passes g on


def test_max_pool2d_and_max_agree_on_a_window_with_a_nan():
    x = np.array([[[[0.5, np.nan], [2.0, 1.0]]]], np.float32)  # one 2x2 window
    pooled = dq.jit(dq.grad(lambda x: dq.sum(dq.max_pool2d(x, 2))), target="cpu")(x)
    reduced = dq.jit(dq.grad(lambda x: dq.sum(dq.max(x, axis=(2, 3)))), target="cpu")(x)
    np.testing.assert_array_equal(pooled, reduced)
    np.testing.assert_array_equal(reduced[0, 0], [[0.0, 1.0], [0.0, 0.0]])
