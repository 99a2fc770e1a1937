"""Normalization layers with torch's semantics, composed of DSL ops:

    state = dq.nn.batch_norm_state(16)                     # running mean 0, running var 1
    y, state = dq.nn.batch_norm(x, state, weight, bias, training=True)    # NCHW: channels axis 1
    y, _ = dq.nn.batch_norm(x, state, weight, bias, training=False)       # the running statistics
    y = dq.nn.group_norm(x, 4, weight, bias)

Training normalizes by the batch's mean and biased variance and moves the running statistics
by `momentum` towards the batch's (the variance unbiased), as torch.nn.BatchNorm2d; flax's
momentum is 1 - torch's. The state is a pytree (a namedtuple of arrays), so a jitted step
takes it and returns the new one.
"""

from __future__ import annotations

import math
from collections import namedtuple

from ..ir.types import F32
from . import ops
from .constants import ones, zeros
from .context import shape_error
from .ops import normalize_axes, shape_of

BatchNormState = namedtuple("BatchNormState", "mean var")


def batch_norm_state(num_features: int, dtype=F32) -> BatchNormState:
    """Running statistics as torch initializes them: mean 0, variance 1."""
    return BatchNormState(zeros((num_features,), dtype), ones((num_features,), dtype))


def _affine(y, weight, bias, shape):
    if weight is not None:
        y = ops.multiply(y, ops.reshape(weight, shape))
    if bias is not None:
        y = ops.add(y, ops.reshape(bias, shape))
    return y


def batch_norm(
    x, state, weight=None, bias=None, training=True, momentum=0.1, eps=1e-5, axis=1
) -> tuple:
    """(normalized x, new state): statistics over every axis but the channel `axis`."""
    shape = tuple(shape_of(x))
    (axis,) = normalize_axes(axis, shape, "batch_norm")
    axes = tuple(a for a in range(len(shape)) if a != axis)
    channel = tuple(shape[a] if a == axis else 1 for a in range(len(shape)))
    if not training:
        mean, var = ops.reshape(state.mean, channel), ops.reshape(state.var, channel)
        y = ops.multiply(ops.subtract(x, mean), ops.rsqrt(ops.add(var, eps)))
        return _affine(y, weight, bias, channel), state
    count = math.prod(shape[a] for a in axes)
    if count < 2:
        raise shape_error(
            f"batch_norm: training needs more than one value per channel, got {shape}"
        )
    mean = ops.mean(x, axes, keepdims=True)
    centred = ops.subtract(x, mean)
    var = ops.mean(ops.square(centred), axes, keepdims=True)
    y = _affine(ops.multiply(centred, ops.rsqrt(ops.add(var, eps))), weight, bias, channel)
    flat = (shape[axis],)
    unbiased = ops.multiply(ops.reshape(var, flat), count / (count - 1))
    new = BatchNormState(
        ops.add(
            ops.multiply(1 - momentum, state.mean), ops.multiply(momentum, ops.reshape(mean, flat))
        ),
        ops.add(ops.multiply(1 - momentum, state.var), ops.multiply(momentum, unbiased)),
    )
    return y, new


def group_norm(x, num_groups: int, weight=None, bias=None, eps=1e-5):
    """torch's group_norm of x (N, C, ...): mean and biased variance over each group of
    C / num_groups channels and the other axes, then the per-channel affine."""
    shape = tuple(shape_of(x))
    if len(shape) < 2 or shape[1] % num_groups:
        raise shape_error(
            f"group_norm: {shape[1:2]} channels do not split into {num_groups} groups"
        )
    grouped = ops.reshape(x, (shape[0], num_groups, -1))
    mean = ops.mean(grouped, 2, keepdims=True)
    centred = ops.subtract(grouped, mean)
    var = ops.mean(ops.square(centred), 2, keepdims=True)
    y = ops.reshape(ops.multiply(centred, ops.rsqrt(ops.add(var, eps))), shape)
    return _affine(y, weight, bias, (1, shape[1]) + (1,) * (len(shape) - 2))
