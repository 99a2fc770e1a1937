"""Optimizers over pytrees of parameters, in optax's style, written with DSL ops so that an
update runs eagerly on numpy arrays and traces inside a jitted training step alike.

    opt = dq.optim.adam(1e-3)
    state = opt.init(params)                          # a pytree of arrays (jit passes it through)

    @dq.jit
    def step(params, state, x, y):
        loss, grads = dq.value_and_grad(loss_fn)(params, x, y)
        params, state = opt.update(grads, state, params)
        return params, state, loss

Update rules (t counts updates from 1; each leaf keeps its dtype):
    sgd:       p -= lr * g
    momentum:  v = beta * v + g;  p -= lr * v                   (PyTorch's and optax's form)
    adam:      m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
               p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import ops
from .constants import zeros_like
from .primitive import dtype_of
from .pytree import tree_map

# Explicit ops rather than operators: on numpy inputs `a - b` would be numpy's, not ours.

SgdState = namedtuple("SgdState", "")
MomentumState = namedtuple("MomentumState", "velocity")
AdamState = namedtuple("AdamState", "count mu nu")


@dataclass(frozen=True)
class Optimizer:
    """`init(params) -> state`; `update(grads, state, params) -> (new params, new state)`.
    The state is a pytree of arrays with the parameters' dtypes (Adam's step count is i32)."""

    init: Callable
    update: Callable


def _descend(params, step, lr):
    """params - lr * step, leaf by leaf."""
    return tree_map(lambda p, s: ops.subtract(p, ops.multiply(lr, s)), params, step)


def sgd(lr: float) -> Optimizer:
    """Plain gradient descent: p -= lr * g."""

    def update(grads, state, params):
        return _descend(params, grads, lr), state

    return Optimizer(lambda params: SgdState(), update)


def momentum(lr: float, beta: float = 0.9) -> Optimizer:
    """Heavy-ball momentum: v = beta * v + g; p -= lr * v (velocity starts at zero)."""

    def init(params):
        return MomentumState(tree_map(zeros_like, params))

    def update(grads, state, params):
        velocity = tree_map(lambda v, g: ops.add(ops.multiply(beta, v), g), state.velocity, grads)
        return _descend(params, velocity, lr), MomentumState(velocity)

    return Optimizer(init, update)


def adam(lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Optimizer:
    """Adam (Kingma and Ba) with bias-corrected moments; eps is added outside the square
    root, as optax and PyTorch do."""

    def init(params):
        zeros = tree_map(zeros_like, params)
        return AdamState(np.zeros((), np.int32), zeros, zeros)

    def update(grads, state, params):
        count = ops.add(state.count, 1)
        mu = tree_map(
            lambda m, g: ops.add(ops.multiply(b1, m), ops.multiply(1 - b1, g)), state.mu, grads
        )
        nu = tree_map(
            lambda v, g: ops.add(ops.multiply(b2, v), ops.multiply(1 - b2, ops.square(g))),
            state.nu,
            grads,
        )

        def step(m, v):
            t = ops.astype(count, dtype_of(m))  # the corrections in the leaf's dtype
            m_hat = ops.divide(m, ops.subtract(1, ops.power(b1, t)))
            v_hat = ops.divide(v, ops.subtract(1, ops.power(b2, t)))
            return ops.divide(m_hat, ops.add(ops.sqrt(v_hat), eps))

        return _descend(params, tree_map(step, mu, nu), lr), AdamState(count, mu, nu)

    return Optimizer(init, update)
