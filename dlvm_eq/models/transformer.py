"""A 2-layer transformer encoder that learns to sort sequences of digits: learned token and
position embeddings (`dq.take`), multi-head self-attention through batched matmuls, layer norm,
a GELU MLP, post-norm residual blocks, and a per-position classifier over the 10 digits.

    params = init_params(seed=0)
    value = loss(params, tokens, targets_onehot)    # tokens: (B, T) int32
    x, y = sorting_task(1000, seed=1)               # digit sequences and their sorted versions
"""

from __future__ import annotations

import numpy as np

from .. import dsl as dq

VOCAB, SEQ, D_MODEL, HEADS, MLP, LAYERS = 10, 8, 64, 4, 128, 2


def sorting_task(n: int, seed: int = 0, seq: int = SEQ):
    """n random digit sequences and the same sequences sorted: the model reads the first and
    predicts, at each position, the digit of the second."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, VOCAB, (n, seq)).astype(np.int32)
    return x, np.sort(x, axis=1).astype(np.int32)


def _attention(p, h, layer: int):
    b, t, d = h.shape
    hd = d // HEADS

    def heads(z):  # (B, T, D) -> (B, H, T, hd)
        return dq.transpose(dq.reshape(z, (b, t, HEADS, hd)), (0, 2, 1, 3))

    q, k, v = (heads(h @ p[f"{n}{layer}"]) for n in ("wq", "wk", "wv"))
    scores = (q @ dq.transpose(k, (0, 1, 3, 2))) * (1.0 / np.sqrt(hd))
    ctx = dq.softmax(scores, axis=-1) @ v  # (B, H, T, hd)
    return dq.reshape(dq.transpose(ctx, (0, 2, 1, 3)), (b, t, d)) @ p[f"wo{layer}"]


def encode(p, tokens):
    h = dq.take(p["tok"], tokens, axis=0) + p["pos"]  # (B, T, D)
    for i in range(LAYERS):
        h = dq.layer_norm(h + _attention(p, h, i), axis=-1) * p[f"g1{i}"] + p[f"be1{i}"]
        mlp = dq.gelu(h @ p[f"w1{i}"] + p[f"b1{i}"]) @ p[f"w2{i}"] + p[f"b2{i}"]
        h = dq.layer_norm(h + mlp, axis=-1) * p[f"g2{i}"] + p[f"be2{i}"]
    return h @ p["out"] + p["out_b"]  # (B, T, VOCAB)


def loss(p, tokens, targets_onehot):
    return dq.mean(dq.softmax_cross_entropy(encode(p, tokens), targets_onehot))


def init_params(seed: int = 0, dtype=np.float32) -> dict:
    rng = np.random.default_rng(seed)

    def w(*shape, scale=None):
        s = scale if scale is not None else 1.0 / np.sqrt(shape[0])
        return (rng.standard_normal(shape) * s).astype(dtype)

    p = {
        "tok": w(VOCAB, D_MODEL, scale=0.5),
        "pos": w(SEQ, D_MODEL, scale=0.5),
        "out": w(D_MODEL, VOCAB),
        "out_b": np.zeros(VOCAB, dtype),
    }
    for i in range(LAYERS):
        p.update(
            {
                f"wq{i}": w(D_MODEL, D_MODEL),
                f"wk{i}": w(D_MODEL, D_MODEL),
                f"wv{i}": w(D_MODEL, D_MODEL),
                f"wo{i}": w(D_MODEL, D_MODEL),
                f"w1{i}": w(D_MODEL, MLP),
                f"b1{i}": np.zeros(MLP, dtype),
                f"w2{i}": w(MLP, D_MODEL),
                f"b2{i}": np.zeros(D_MODEL, dtype),
                f"g1{i}": np.ones(D_MODEL, dtype),
                f"be1{i}": np.zeros(D_MODEL, dtype),
                f"g2{i}": np.ones(D_MODEL, dtype),
                f"be2{i}": np.zeros(D_MODEL, dtype),
            }
        )
    return p
