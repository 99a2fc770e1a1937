"""Shared checks for the DSL vocabulary tests: values against numpy, gradients against float64
central differences, both through `dq.jit` on each target.

    assert_values(dq.silu, (x,), x / (1 + np.exp(-x)), "cpu")
    assert_grads(lambda x: dq.sum(dq.silu(x)), (x,), "interp")
"""

from __future__ import annotations

import numpy as np

import dlvm_eq as dq
from dlvm_eq.pipeline import check_grads

TARGETS = ("interp", "cpu")


def assert_values(f, args, expected, target, rtol=1e-5, atol=1e-6):
    got = dq.jit(f, target=target)(*args)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=rtol, atol=atol)
    return got


def assert_grads(f, args, target, argnums=None, seed=0, rtol=1e-5, atol=1e-8):
    """f's gradient compiled for `target` (arguments in float64) against central differences of
    f run eagerly on float64 numpy arrays, along a random direction."""

    def grad(fn, argnums):
        return dq.jit(dq.grad(fn, argnums=argnums), target=target)

    check_grads(f, args, grad=grad, argnums=argnums, seed=seed, rtol=rtol, atol=atol)
