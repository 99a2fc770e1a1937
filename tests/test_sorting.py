"""sort, argsort and top_k (issue 31) against numpy's stable sort, with ties and NaN, through
dq.jit on cpu and interp; gradients (the adjoint scattered back to the source positions)
against float64 central differences where the order is locally constant (distinct values)."""

from __future__ import annotations

import numpy as np
import pytest
from vocab_checks import TARGETS, assert_grads

import dlvm_eq as dq

RNG = np.random.default_rng(3)
TIES = np.array([[3.0, 1.0, np.nan, 1.0, 2.0, 1.0], [5.0, 5.0, -1.0, 0.0, 7.0, np.nan]], np.float32)


@pytest.mark.parametrize("target", TARGETS)
def test_sort_and_argsort_match_numpys_stable_sort(target):
    x = RNG.integers(0, 4, size=(3, 7, 5)).astype(np.float32)  # many ties
    for axis in (0, 1, -1):
        np.testing.assert_array_equal(
            dq.jit(lambda x, a=axis: dq.sort(x, a), target=target)(x), np.sort(x, axis)
        )
        got = dq.jit(lambda x, a=axis: dq.argsort(x, a), target=target)(x)
        np.testing.assert_array_equal(got, np.argsort(x, axis, kind="stable"))
    np.testing.assert_array_equal(dq.jit(dq.sort, target=target)(TIES), np.sort(TIES))
    np.testing.assert_array_equal(
        dq.jit(dq.argsort, target=target)(TIES), np.argsort(TIES, kind="stable")
    )


@pytest.mark.parametrize("target", TARGETS)
def test_descending_and_top_k_put_nan_first_and_ties_in_index_order(target):
    desc = dq.jit(lambda x: dq.sort(x, descending=True), target=target)(TIES)
    np.testing.assert_array_equal(desc, [[np.nan, 3, 2, 1, 1, 1], [np.nan, 7, 5, 5, 0, -1]])
    order = dq.jit(lambda x: dq.argsort(x, descending=True), target=target)(TIES)
    np.testing.assert_array_equal(order, [[2, 0, 4, 1, 3, 5], [5, 4, 0, 1, 3, 2]])
    values, indices = dq.jit(lambda x: dq.top_k(x, 4), target=target)(TIES)
    np.testing.assert_array_equal(indices, order[:, :4])
    np.testing.assert_array_equal(values, desc[:, :4])
    assert indices.dtype == np.int32


@pytest.mark.parametrize("target", TARGETS)
def test_gradients_scatter_back_to_the_source_positions(target):
    x = RNG.permutation(24).reshape(4, 6) + RNG.uniform(0, 0.1, (4, 6))  # distinct values
    w = RNG.standard_normal((4, 6))
    assert_grads(lambda x: dq.sum(dq.sort(x, axis=0) * w), (x,), target)
    assert_grads(lambda x: dq.sum(dq.top_k(x, 3)[0] * w[:, :3]), (x,), target)
    # the gradient is the weights put back where each sorted value came from
    g = dq.jit(dq.grad(lambda x: dq.sum(dq.sort(x) * w)), target=target)(x)
    np.testing.assert_array_equal(np.take_along_axis(g, np.argsort(x, -1), -1), w)


def test_bad_k_is_a_shape_error():
    with pytest.raises(dq.ShapeError, match="top_k: k must be in 1..6"):
        dq.make_ir(lambda x: dq.top_k(x, 7))(TIES)
