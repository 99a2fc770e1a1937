"""A small convolutional classifier for scikit-learn's 8x8 digits: conv 3x3 (32), ReLU, 2x2
max-pool, conv 3x3 (64), ReLU, 2x2 max-pool, dense 10, mean softmax cross-entropy; optionally
batch norm after each convolution and dropout before the dense layer.

    params = init_params(seed=0)                # a dict pytree
    value = loss(params, images, onehot)        # images: (N, 1, 8, 8) float32

    params = init_params(seed=0, batch_norm=True)            # conv biases become BN's shifts
    norm = norm_state()                                      # running statistics, a pytree
    value, norm = train_loss(params, norm, images, onehot, key, rate=0.25)  # training mode
    out = logits(params, images, norm)                       # evaluation: running statistics
"""

from __future__ import annotations

import numpy as np

from .. import dsl as dq

CHANNELS = (32, 64)


def _block(params, x, i: int, norm, training: bool, new: dict):
    """conv, then bias or batch norm (whose shift is the bias), ReLU, 2x2 max-pool."""
    h = dq.conv2d(x, params[f"c{i}"], padding=1)
    if norm is None:
        h = h + dq.reshape(params[f"b{i}"], (1, -1, 1, 1))
    else:
        h, new[f"bn{i}"] = dq.nn.batch_norm(
            h, norm[f"bn{i}"], params[f"g{i}"], params[f"b{i}"], training=training
        )
    return dq.max_pool2d(dq.relu(h), 2)


def features(params, x, norm=None, training: bool = False):
    """(flattened features, new running statistics): `norm` None means no batch norm."""
    new: dict = {}
    h = _block(params, x, 1, norm, training, new)
    h = _block(params, h, 2, norm, training, new)
    return dq.reshape(h, (h.shape[0], -1)), (new if norm is not None else None)


def logits(params, x, norm=None):
    """Evaluation mode: batch norm by the running statistics `norm`, no dropout."""
    return features(params, x, norm)[0] @ params["w"] + params["b"]


def loss(params, x, onehot):
    return dq.mean(dq.softmax_cross_entropy(logits(params, x), onehot))


def train_loss(params, norm, x, onehot, key, rate: float = 0.0):
    """Training mode: (mean cross-entropy, new running statistics), batch norm by the batch's
    statistics (when `norm` is given) and dropout of the features at `rate` under `key`."""
    h, new = features(params, x, norm, training=True)
    if rate:
        h = dq.nn.dropout(key, rate, h)
    value = dq.mean(dq.softmax_cross_entropy(h @ params["w"] + params["b"], onehot))
    return value, new


def norm_state() -> dict:
    """Batch norm's running statistics for both convolutions, as torch initializes them."""
    return {f"bn{i + 1}": dq.nn.batch_norm_state(c) for i, c in enumerate(CHANNELS)}


def init_params(image: int = 8, seed: int = 0, dtype=np.float32, batch_norm: bool = False):
    """He-initialised convolutions and dense layer, zero biases; with batch norm, unit scales
    g1, g2 (the biases b1, b2 are then batch norm's shifts)."""
    rng = np.random.default_rng(seed)
    c1, c2 = CHANNELS

    def he(*shape):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(dtype)

    flat = c2 * (image // 4) ** 2
    params = {
        "c1": he(c1, 1, 3, 3),
        "b1": np.zeros(c1, dtype),
        "c2": he(c2, c1, 3, 3),
        "b2": np.zeros(c2, dtype),
        "w": he(flat, 10).reshape(flat, 10) * 0.5,
        "b": np.zeros(10, dtype),
    }
    if batch_norm:
        params.update(g1=np.ones(c1, dtype), g2=np.ones(c2, dtype))
    return params
