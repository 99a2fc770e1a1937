"""Numerically stable composites, built from primitives only (so the adjoint rules and the
e-graph see nothing new): subtract the maximum (softmax: its floor) before `exp`.

    softmax(x)    = exp(x - m) / sum(exp(x - m)),  m = floor(max(x))
    logsumexp(x)  = max(x) + log(sum(exp(x - max(x))))

As `dq.nn`, this module also holds jax.nn's other names: `dq.nn.silu`, `dq.nn.one_hot`, ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Explicit ops rather than operators: on numpy inputs `a - b` would be numpy's, not ours.
from . import ops
from .activations import (
    celu,
    elu,
    glu,
    hard_tanh,
    leaky_relu,
    log_sigmoid,
    mish,
    relu6,
    selu,
    silu,
    softsign,
    swish,
)
from .layers import gelu, layer_norm, one_hot
from .norms import BatchNormState, batch_norm, batch_norm_state, group_norm
from .ops import normalize_axes, relu, shape_of, sigmoid, softplus
from .random import dropout

JAX_NN: tuple[Callable[..., Any], ...] = (
    elu,
    gelu,
    hard_tanh,
    leaky_relu,
    log_sigmoid,
    one_hot,
    relu,
    relu6,
    sigmoid,
    silu,
)
JAX_NN += (
    celu,
    glu,
    mish,
    selu,
    softplus,
    softsign,
    swish,
)  # re-exported: dq.nn.<name> as jax.nn.<name>
soft_sign = softsign  # jax.nn's spelling
JAX_NN += (soft_sign,)
LAYERS = (
    BatchNormState,
    batch_norm,
    batch_norm_state,
    dropout,
    group_norm,
    layer_norm,
)  # and layers


def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) along `axis`, stable for large inputs."""
    axis = normalize_axes(axis, shape_of(x), "softmax")
    e = ops.exp(ops.subtract(x, _shift(x, axis)))
    return ops.divide(e, ops.sum(e, axis, keepdims=True))


def log_softmax(x, axis=-1):
    """x - logsumexp(x) along `axis`, stable for large inputs."""
    axis = normalize_axes(axis, shape_of(x), "log_softmax")
    shifted = ops.subtract(x, ops.max(x, axis, keepdims=True))
    return ops.subtract(shifted, ops.log(ops.sum(ops.exp(shifted), axis, keepdims=True)))


def logsumexp(x, axis=None, keepdims=False):
    """log(sum(exp(x))) over `axis` (None: all axes), stable for large inputs."""
    shape = shape_of(x)
    axes = normalize_axes(axis, shape, "logsumexp")
    m = ops.max(x, axes, keepdims=True)
    s = ops.log(ops.sum(ops.exp(ops.subtract(x, m)), axes, keepdims=keepdims))
    if not keepdims:
        m = ops.reshape(m, tuple(d for i, d in enumerate(shape) if i not in axes))
    return ops.add(s, m)


def softmax_cross_entropy(logits, onehot, axis=-1):
    """Per-row loss -sum(onehot * log_softmax(logits)) along `axis` (the class axis)."""
    axis = normalize_axes(axis, shape_of(logits), "softmax_cross_entropy")
    return ops.negative(ops.sum(ops.multiply(onehot, log_softmax(logits, axis)), axis))


def _shift(x, axes):
    """floor(max(x)) along `axes`: within 1 of the maximum, so exp(x - shift) stays in [0, e)
    and the row's largest term is >= 1 (as stable as subtracting the max), and piecewise
    constant, so no adjoint flows back through it. Softmax is shift invariant: the adjoint
    through a max shift sums to exactly zero, and computing it costs passes over the whole
    tensor (the tie mask, its count, a sum of the shifted adjoint). JAX's softmax gets the same
    with stop_gradient(max)."""
    return ops.floor(ops.max(x, axes, keepdims=True))


def standardize(x, axis=-1, eps=1e-5):
    """(x - mean) / sqrt(var + eps) along `axis`, as jax.nn.standardize."""
    axes = normalize_axes(axis, shape_of(x), "standardize")
    centred = ops.subtract(x, ops.mean(x, axes, keepdims=True))
    variance = ops.mean(ops.square(centred), axes, keepdims=True)
    return ops.multiply(centred, ops.rsqrt(ops.add(variance, eps)))
