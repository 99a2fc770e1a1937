"""Losses as optax and torch.nn.functional define them, composed of DSL ops:

    dq.losses.mse(pred, target)                       # mean((pred - target)^2)
    dq.losses.huber(pred, target, delta=1.0)          # torch's huber_loss, optax's huber_loss
    dq.losses.nll(log_probs, labels)                  # torch's nll_loss: integer labels
    dq.losses.softmax_cross_entropy_with_integer_labels(logits, labels)   # optax's, per row

reduction: "mean" (torch's default), "sum" or "none" (optax's losses are "none": per element,
or per row for the class-axis losses). optax's own names, per element as optax has them:

    dq.losses.squared_error(pred, target)   huber_loss(pred, target, delta)   l2_loss(pred, target)
"""

from __future__ import annotations

from . import ops
from .context import argument_error
from .nn import log_softmax
from .ops import normalize_axes, shape_of
from .shapes import expand_dims, squeeze, take_along_axis


def _reduce(loss, reduction: str, name: str):
    if reduction == "mean":
        return ops.mean(loss)
    if reduction == "sum":
        return ops.sum(loss)
    if reduction == "none":
        return loss
    raise argument_error(f"{name}: reduction must be 'mean', 'sum' or 'none', not {reduction!r}")


def mse(predictions, targets, reduction="mean"):
    """(predictions - targets)^2, reduced (torch's mse_loss; optax's squared_error is "none")."""
    return _reduce(ops.square(ops.subtract(predictions, targets)), reduction, "mse")


def huber(predictions, targets, delta=1.0, reduction="mean"):
    """0.5 d^2 where |d| <= delta, else delta (|d| - delta / 2), d = predictions - targets.
    Written as 0.5 q^2 + delta (|d| - q) with q = min(|d|, delta), as optax does: one
    expression, its derivative continuous at |d| = delta."""
    err = ops.abs(ops.subtract(predictions, targets))
    q = ops.minimum(err, delta)
    loss = ops.add(ops.multiply(0.5, ops.square(q)), ops.multiply(delta, ops.subtract(err, q)))
    return _reduce(loss, reduction, "huber")


def squared_error(predictions, targets=None):
    """optax.squared_error: (predictions - targets)^2 per element (targets None: 0)."""
    return mse(predictions, 0.0 if targets is None else targets, reduction="none")


def huber_loss(predictions, targets=None, delta=1.0):
    """optax.huber_loss: `huber` per element (targets None: 0)."""
    return huber(predictions, 0.0 if targets is None else targets, delta, reduction="none")


def l2_loss(predictions, targets=None):
    """optax.l2_loss: half the squared error, per element."""
    return ops.multiply(0.5, squared_error(predictions, targets))


def nll(log_probs, labels, axis=-1, reduction="mean"):
    """-log_probs at each integer label along the class `axis` (torch's nll_loss, whose class
    axis is 1 for (N, C) inputs: the last axis here, unless `axis` says)."""
    (axis,) = normalize_axes(axis, shape_of(log_probs), "nll")
    picked = take_along_axis(log_probs, expand_dims(labels, axis), axis)
    return _reduce(ops.negative(squeeze(picked, axis)), reduction, "nll")


def softmax_cross_entropy_with_integer_labels(logits, labels, axis=-1):
    """-log_softmax(logits)[label] per row, as optax's (no reduction)."""
    return nll(log_softmax(logits, axis), labels, axis, reduction="none")
