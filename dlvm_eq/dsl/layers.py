"""Deep-learning building blocks composed of primitive ops (so the adjoint rules and the
e-graph see nothing new): `gelu`, `layer_norm`, `one_hot`.

    dq.gelu(x, approximate=True)     # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    dq.layer_norm(x, axis=-1)        # (x - mean) / sqrt(var + eps) over the last axis
    dq.one_hot(ids, 10)              # f32 rows with a 1 at each id (none for ids out of range)
"""

from __future__ import annotations

import math
import sys

from ..errors import DlvmError
from ..ir.types import F32
from . import ops
from .constants import arange
from .context import located, shape_error
from .ops import normalize_axes, shape_of
from .primitive import dtype_of, to_dtype

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu(x, approximate=False):
    """x * Phi(x) (Hendrycks and Gimpel): exact with `erf`, or the tanh form with
    `approximate=True`, as `jax.nn.gelu` and PyTorch's `approximate="tanh"`."""
    if approximate:
        inner = ops.multiply(_SQRT_2_OVER_PI, ops.add(x, ops.multiply(0.044715, ops.power(x, 3))))
        return ops.multiply(ops.multiply(0.5, x), ops.add(1, ops.tanh(inner)))
    erf = _erf()
    if erf is None:
        raise DlvmError(
            located(
                "gelu(approximate=False) needs dq.erf, which this build of the "
                "DSL does not have; use gelu(x, approximate=True) (the tanh "
                "form)"
            )
        )
    return ops.multiply(ops.multiply(0.5, x), ops.add(1, erf(ops.multiply(x, math.sqrt(0.5)))))


def _erf():
    """The DSL's `erf`, a primitive op of its own (not a composition): None until the op table
    has it. Looked up at call time, in the op module or wherever the DSL exports it."""
    return getattr(ops, "erf", None) or getattr(sys.modules[__package__], "erf", None)


def layer_norm(x, axis=-1, eps=1e-5, weight=None, bias=None):
    """(x - mean) / sqrt(var + eps) over `axis` (an int or a tuple), then `* weight + bias`
    where given (they broadcast against x), as `torch.nn.functional.layer_norm`."""
    axes = normalize_axes(axis, shape_of(x), "layer_norm")
    centred = ops.subtract(x, ops.mean(x, axes, keepdims=True))
    variance = ops.mean(ops.square(centred), axes, keepdims=True)
    out = ops.multiply(centred, ops.rsqrt(ops.add(variance, eps)))
    if weight is not None:
        out = ops.multiply(out, weight)
    if bias is not None:
        out = ops.add(out, bias)
    return out


def one_hot(ids, n, dtype=F32):
    """ids of shape S -> shape S + (n,): 1 where the last index equals the id, else 0."""
    if not isinstance(n, int) or n <= 0:
        raise shape_error(f"one_hot: the number of classes must be a positive int, got {n!r}")
    if dtype_of(ids).is_float:
        raise shape_error("one_hot: ids must be integers, got float ids")
    shape = tuple(shape_of(ids))
    hits = ops.equal(ops.reshape(ids, shape + (1,)), arange(n))
    return ops.astype(hits, to_dtype(dtype))
