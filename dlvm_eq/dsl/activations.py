"""Activation functions under JAX's names (`jax.nn`), composed of primitive ops so that their
adjoints come from the rules of the ops they are made of:

    dq.silu(x)              # x * sigmoid(x)   (jax.nn.silu, torch's SiLU; alias swish)
    dq.leaky_relu(x, 0.01)  # where(x >= 0, x, 0.01 x)
    dq.elu(x, alpha=1.0)    # where(x > 0, x, alpha expm1(x))
    dq.log_sigmoid(x)       # -softplus(-x): stable for large |x|
    dq.nn.celu, selu, softsign, mish, glu, relu6, hard_tanh    # the rest of jax.nn's

Derivatives at the kinks follow JAX: leaky_relu'(0) = 1, elu'(0) = alpha (the left branch),
relu6'(0) = relu6'(6) = 0, hard_tanh'(+-1) = 1.
"""

from __future__ import annotations

from . import ops
from .indexing import split


def silu(x):
    """x * sigmoid(x), as jax.nn.silu."""
    return ops.multiply(x, ops.sigmoid(x))


swish = silu


def leaky_relu(x, negative_slope=0.01):
    """x where x >= 0, else negative_slope * x, as jax.nn.leaky_relu."""
    return ops.where(ops.greater_equal(x, 0), x, ops.multiply(negative_slope, x))


def elu(x, alpha=1.0):
    """x where x > 0, else alpha * (exp(x) - 1), as jax.nn.elu. expm1 reads 0 where x > 0, so
    the discarded branch never overflows (its inf would make the adjoint 0 * inf = NaN)."""
    positive = ops.greater(x, 0)
    negative = ops.multiply(alpha, ops.expm1(ops.where(positive, 0, x)))
    return ops.where(positive, x, negative)


def log_sigmoid(x):
    """log(sigmoid(x)) = -softplus(-x), as jax.nn.log_sigmoid."""
    return ops.negative(ops.softplus(ops.negative(x)))


def relu6(x):
    """min(max(x, 0), 6), as jax.nn.relu6 (derivative 0 at 0 and at 6)."""
    return ops.where(ops.less(x, 6), ops.relu(x), 6)


def hard_tanh(x):
    """x clipped to [-1, 1], as jax.nn.hard_tanh (derivative 1 at -1 and 1)."""
    return ops.where(ops.greater(x, 1), 1, ops.where(ops.less(x, -1), -1, x))


def celu(x, alpha=1.0):
    """x where x > 0, else alpha * (exp(x / alpha) - 1), as jax.nn.celu."""
    positive = ops.greater(x, 0)
    negative = ops.multiply(alpha, ops.expm1(ops.divide(ops.where(positive, 0, x), alpha)))
    return ops.where(positive, x, negative)


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772, 1.0507009873554805


def selu(x):
    """scale * elu(x, alpha) with the self-normalizing constants, as jax.nn.selu."""
    return ops.multiply(_SELU_SCALE, elu(x, _SELU_ALPHA))


def softsign(x):
    """x / (1 + |x|), as jax.nn.soft_sign."""
    return ops.divide(x, ops.add(1, ops.abs(x)))


def mish(x):
    """x * tanh(softplus(x)), as jax.nn.mish."""
    return ops.multiply(x, ops.tanh(ops.softplus(x)))


def glu(x, axis=-1):
    """a * sigmoid(b) for the two halves a, b of x along `axis`, as jax.nn.glu."""
    a, b = split(x, 2, axis=axis)
    return ops.multiply(a, ops.sigmoid(b))
