"""A ReLU MLP classifier with mean softmax cross-entropy: the DSL loss, its hand-written numpy
training step (the baseline every benchmark compares against), and initialisation.

    params = init_params([784, 256, 10], seed=0)
    loss_value = loss(*params, x, onehot)       # works eagerly on numpy and traced by dq.jit
"""

from __future__ import annotations

import numpy as np

from .. import dsl as dq


def loss(w1, b1, w2, b2, x, onehot):
    """Mean softmax cross-entropy of a one-hidden-layer ReLU network."""
    h = dq.relu(x @ w1 + b1)
    return dq.mean(dq.softmax_cross_entropy(h @ w2 + b2, onehot))


def logits(w1, b1, w2, b2, x):
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def init_params(sizes, seed=0, dtype=np.float32):
    """He-initialised weights, zero biases: [w1, b1, w2, b2, ...]."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        params.append(
            (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(dtype)
        )
        params.append(np.zeros(fan_out, dtype))
    return params


def numpy_value_and_grad(w1, b1, w2, b2, x, onehot):
    """The hand-written forward and backward pass: 2 forward and 3 backward matmuls."""
    z1 = x @ w1
    z1 += b1
    h = np.maximum(z1, 0, out=z1)
    z2 = h @ w2
    z2 += b2
    z2 -= z2.max(axis=1, keepdims=True)
    e = np.exp(z2)
    s = e.sum(axis=1, keepdims=True)
    n = x.shape[0]
    loss_value = np.mean(np.log(s[:, 0]) - (z2 * onehot).sum(axis=1))
    dz2 = e / s
    dz2 -= onehot
    dz2 *= 1.0 / n
    dw2 = h.T @ dz2
    db2 = dz2.sum(axis=0)
    dh = dz2 @ w2.T
    dh *= h > 0
    dw1 = x.T @ dh
    db1 = dh.sum(axis=0)
    return loss_value, (dw1, db1, dw2, db2)


def sgd(params, grads, lr):
    for p, g in zip(params, grads):
        p -= lr * g
    return params


def accuracy(params, x, labels) -> float:
    return float(np.mean(np.argmax(logits(*params, x), axis=1) == labels))
