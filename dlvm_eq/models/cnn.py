"""A small convolutional classifier for scikit-learn's 8x8 digits: conv 3x3 (16), ReLU, 2x2
max-pool, conv 3x3 (32), ReLU, 2x2 max-pool, dense 10, mean softmax cross-entropy.

    params = init_params(seed=0)                # a dict pytree
    value = loss(params, images, onehot)        # images: (N, 1, 8, 8) float32
    labels = predict(params, images)            # eager numpy, through the same DSL ops
"""

from __future__ import annotations

import numpy as np

from .. import dsl as dq

CHANNELS = (32, 64)


def features(params, x):
    h = dq.max_pool2d(
        dq.relu(dq.conv2d(x, params["c1"], padding=1) + dq.reshape(params["b1"], (1, -1, 1, 1))), 2
    )
    h = dq.max_pool2d(
        dq.relu(dq.conv2d(h, params["c2"], padding=1) + dq.reshape(params["b2"], (1, -1, 1, 1))), 2
    )
    return dq.reshape(h, (h.shape[0], -1))


def logits(params, x):
    return features(params, x) @ params["w"] + params["b"]


def loss(params, x, onehot):
    return dq.mean(dq.softmax_cross_entropy(logits(params, x), onehot))


def init_params(image: int = 8, seed: int = 0, dtype=np.float32) -> dict:
    """He-initialised convolutions and dense layer, zero biases."""
    rng = np.random.default_rng(seed)
    c1, c2 = CHANNELS

    def he(*shape):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(dtype)

    flat = c2 * (image // 4) ** 2
    return {
        "c1": he(c1, 1, 3, 3),
        "b1": np.zeros(c1, dtype),
        "c2": he(c2, c1, 3, 3),
        "b2": np.zeros(c2, dtype),
        "w": he(flat, 10).reshape(flat, 10) * 0.5,
        "b": np.zeros(10, dtype),
    }
