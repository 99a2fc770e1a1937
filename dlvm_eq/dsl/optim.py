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
    adamw:     adam's step plus weight_decay * p, times lr (decoupled weight decay, optax's
               form; torch's p *= 1 - lr wd before the step is the same update)

`lr` is a number or a schedule, a function of the update count (0 first; schedules.py, e.g.
`warmup_cosine_decay_schedule`); with a schedule, sgd's and momentum's states count updates
(`ScheduleState`). `clip_by_global_norm(grads, max_norm)` scales a gradient pytree (a function,
where optax has a transformation to chain).
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable

import numpy as np

from ..records import dataclass
from . import ops
from .constants import zeros_like
from .primitive import dtype_of
from .pytree import tree_leaves, tree_map
from .schedules import (
    constant_schedule,
    cosine_decay_schedule,
    exponential_decay,
    linear_schedule,
    warmup_cosine_decay_schedule,
)

# Explicit ops rather than operators: on numpy inputs `a - b` would be numpy's, not ours.

SgdState = namedtuple("SgdState", "")
MomentumState = namedtuple("MomentumState", "velocity")
AdamState = namedtuple("AdamState", "count mu nu")
ScheduleState = namedtuple("ScheduleState", "count inner")


@dataclass(frozen=True)
class Optimizer:
    """`init(params) -> state`; `update(grads, state, params) -> (new params, new state)`.
    The state is a pytree of arrays with the parameters' dtypes (Adam's step count is i32)."""

    init: Callable
    update: Callable


def _descend(params, step, lr):
    """params - lr * step, leaf by leaf."""
    return tree_map(lambda p, s: ops.subtract(p, ops.multiply(lr, s)), params, step)


def _scheduled(init, update_at, lr) -> Optimizer:
    """An optimizer from init(params) and update_at(grads, state, params, rate); with a
    schedule for lr, its state is ScheduleState(count, inner) and rate = lr(count)."""
    if not callable(lr):
        return Optimizer(init, lambda grads, state, params: update_at(grads, state, params, lr))

    def init_counted(params):
        return ScheduleState(np.zeros((), np.int32), init(params))

    def update(grads, state, params):
        params, inner = update_at(grads, state.inner, params, lr(state.count))
        return params, ScheduleState(ops.add(state.count, 1), inner)

    return Optimizer(init_counted, update)


def sgd(lr) -> Optimizer:
    """Plain gradient descent: p -= lr * g."""

    def update(grads, state, params, rate):
        return _descend(params, grads, rate), state

    return _scheduled(lambda params: SgdState(), update, lr)


def momentum(lr, beta: float = 0.9) -> Optimizer:
    """Heavy-ball momentum: v = beta * v + g; p -= lr * v (velocity starts at zero)."""

    def init(params):
        return MomentumState(tree_map(zeros_like, params))

    def update(grads, state, params, rate):
        velocity = tree_map(lambda v, g: ops.add(ops.multiply(beta, v), g), state.velocity, grads)
        return _descend(params, velocity, rate), MomentumState(velocity)

    return _scheduled(init, update, lr)


def adam(lr, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Optimizer:
    """Adam (Kingma and Ba) with bias-corrected moments; eps is added outside the square
    root, as optax and PyTorch do."""
    return _adam(lr, b1, b2, eps, 0.0)


def adamw(
    lr, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 1e-4
) -> Optimizer:
    """Adam with decoupled weight decay (Loshchilov and Hutter): p -= lr * (adam step +
    weight_decay * p), optax's adamw (its default decay 1e-4; torch's AdamW defaults to 1e-2)."""
    return _adam(lr, b1, b2, eps, weight_decay)


def _adam(lr, b1, b2, eps, weight_decay) -> Optimizer:
    def init(params):
        zeros = tree_map(zeros_like, params)
        return AdamState(np.zeros((), np.int32), zeros, zeros)

    def update(grads, state, params):
        rate = lr(state.count) if callable(lr) else lr  # the schedule at the count before this
        count = ops.add(state.count, 1)
        mu = tree_map(
            lambda m, g: ops.add(ops.multiply(b1, m), ops.multiply(1 - b1, g)), state.mu, grads
        )
        nu = tree_map(
            lambda v, g: ops.add(ops.multiply(b2, v), ops.multiply(1 - b2, ops.square(g))),
            state.nu,
            grads,
        )

        def step(m, v, p):
            t = ops.astype(count, dtype_of(m))  # the corrections in the leaf's dtype
            m_hat = ops.divide(m, ops.subtract(1, ops.power(b1, t)))
            v_hat = ops.divide(v, ops.subtract(1, ops.power(b2, t)))
            out = ops.divide(m_hat, ops.add(ops.sqrt(v_hat), eps))
            return ops.add(out, ops.multiply(weight_decay, p)) if weight_decay else out

        steps = tree_map(step, mu, nu, params)
        return _descend(params, steps, rate), AdamState(count, mu, nu)

    return Optimizer(init, update)


def global_norm(tree):
    """sqrt of the sum of squares of every leaf (optax.global_norm)."""
    total = None
    for leaf in tree_leaves(tree):
        part = ops.sum(ops.square(leaf))
        total = part if total is None else ops.add(total, part)
    return ops.sqrt(total)


def clip_by_global_norm(grads, max_norm: float):
    """grads scaled by max_norm / global_norm(grads) where that norm exceeds max_norm, as
    optax's clip_by_global_norm (a function applied here, not a transformation to chain)."""
    norm = global_norm(grads)
    scale = ops.where(ops.less(norm, max_norm), 1.0, ops.divide(max_norm, norm))
    return tree_map(lambda g: ops.multiply(g, ops.astype(scale, dtype_of(g))), grads)


SCHEDULES = (
    constant_schedule,
    cosine_decay_schedule,
    exponential_decay,
    linear_schedule,
    warmup_cosine_decay_schedule,
)  # re-exported: dq.optim.<schedule> as optax.<schedule>
