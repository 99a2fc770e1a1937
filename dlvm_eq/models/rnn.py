"""A GRU classifier for scikit-learn's 8x8 digits read as a sequence, through `dq.scan`: rows as
steps (8 steps of 8 pixels) or pixel by pixel (64 steps of 1), the last hidden state into a
dense layer, mean softmax cross-entropy.

    params = init_params(inputs=8, seed=0)           # a dict pytree
    xs = as_sequence(images, "rows")                 # (steps, N, inputs) float32
    value = loss(params, xs, onehot)
    scores = logits(params, xs)                      # (N, 10)

The GRU cell (Cho et al. 2014: the reset gate applied to h before the product):
    z = sigmoid(x Wz + h Uz + bz);  r = sigmoid(x Wr + h Ur + br)
    c = tanh(x Wh + (r * h) Uh + bh);  h' = (1 - z) * h + z * c
"""

from __future__ import annotations

import numpy as np

from .. import dsl as dq

HIDDEN = 64


def cell(p, h, x):
    z = dq.sigmoid(x @ p["wz"] + h @ p["uz"] + p["bz"])
    r = dq.sigmoid(x @ p["wr"] + h @ p["ur"] + p["br"])
    c = dq.tanh(x @ p["wh"] + (r * h) @ p["uh"] + p["bh"])
    return (1.0 - z) * h + z * c


def logits(params, xs):
    h0 = dq.zeros((xs.shape[1], params["uz"].shape[0]), xs.dtype)
    h, _ = dq.scan(lambda h, x: (cell(params, h, x), None), h0, xs)
    return h @ params["w"] + params["b"]


def loss(params, xs, onehot):
    return dq.mean(dq.softmax_cross_entropy(logits(params, xs), onehot))


def as_sequence(images: np.ndarray, setting: str = "rows") -> np.ndarray:
    """(N, 64) digits as (steps, N, inputs): "rows" 8 steps of a row, "pixels" 64 of a pixel."""
    n = len(images)
    seq = images.reshape(n, 8, 8) if setting == "rows" else images.reshape(n, 64, 1)
    return np.ascontiguousarray(seq.transpose(1, 0, 2), dtype=np.float32)


def init_params(inputs: int = 8, hidden: int = HIDDEN, seed: int = 0, dtype=np.float32) -> dict:
    """Uniform(-1/sqrt(hidden), 1/sqrt(hidden)) weights as PyTorch's GRU; a Glorot dense layer."""
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(hidden)

    def u(*shape):
        return rng.uniform(-s, s, shape).astype(dtype)

    p = {}
    for g in "zrh":
        p[f"w{g}"], p[f"u{g}"], p[f"b{g}"] = u(inputs, hidden), u(hidden, hidden), u(hidden)
    p["w"] = (rng.standard_normal((hidden, 10)) * np.sqrt(2.0 / (hidden + 10))).astype(dtype)
    p["b"] = np.zeros(10, dtype)
    return p
