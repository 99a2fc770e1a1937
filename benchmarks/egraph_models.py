"""The ordinary models of benchmarks/egraph_value.py (issue 36): training steps written as a
user would write them, not tuned to this compiler. Each function returns (title, loss, args,
argnums), like the models in egraph_value.py.

    from egraph_models import ORDINARY
    title, loss, args, argnums = ORDINARY[0]()
"""

from __future__ import annotations

import math

import numpy as np

rng = np.random.default_rng(1)


def f32(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _onehot(n, classes):
    return np.eye(classes, dtype=np.float32)[rng.integers(0, classes, n)]


def _bias4(b):
    import dlvm_eq as dq

    return dq.reshape(b, (1, -1, 1, 1))


def _resnet(name, B, C, S):
    def model():
        import dlvm_eq as dq

        def loss(w0, w1, b1, w2, b2, wd, bd, x, y):
            h = dq.relu(dq.conv2d(x, w0, padding=1))
            r = dq.relu(dq.conv2d(h, w1, padding=1) + _bias4(b1))
            h = dq.relu(h + dq.conv2d(r, w2, padding=1) + _bias4(b2))
            return dq.mean(dq.softmax_cross_entropy(dq.mean(h, axis=(2, 3)) @ wd + bd, y))

        he = math.sqrt(2.0 / (9 * C))
        args = (
            f32(C, 3, 3, 3, scale=math.sqrt(2.0 / 27)),
            f32(C, C, 3, 3, scale=he),
            f32(C, scale=0.1),
            f32(C, C, 3, 3, scale=he),
            f32(C, scale=0.1),
            f32(C, 10, scale=C**-0.5),
            f32(10, scale=0.1),
            f32(B, 3, S, S),
            _onehot(B, 10),
        )
        return f"ResNet block, batch {B}, {C} channels, {S}x{S}", loss, args, tuple(range(7))

    model.__name__ = name
    return model


def _dwsep(name, B, C, S):
    def model():
        import dlvm_eq as dq

        def loss(d1, p1, b1, d2, p2, b2, wd, x, y):
            h = dq.relu(dq.conv2d(dq.conv2d(x, d1, padding=1, groups=C), p1) + _bias4(b1))
            h = dq.relu(dq.conv2d(dq.conv2d(h, d2, padding=1, groups=C), p2) + _bias4(b2))
            return dq.mean(dq.softmax_cross_entropy(dq.mean(h, axis=(2, 3)) @ wd, y))

        args = (
            f32(C, 1, 3, 3, scale=1 / 3),
            f32(C, C, 1, 1, scale=C**-0.5),
            f32(C, scale=0.1),
            f32(C, 1, 3, 3, scale=1 / 3),
            f32(C, C, 1, 1, scale=C**-0.5),
            f32(C, scale=0.1),
            f32(C, 10, scale=C**-0.5),
            f32(B, C, S, S),
            _onehot(B, 10),
        )
        title = f"depthwise-separable convs x2, batch {B}, {C} channels, {S}x{S}"
        return title, loss, args, tuple(range(7))

    model.__name__ = name
    return model


def text_conv1d():
    import dlvm_eq as dq

    B, T, V, D, F, K = 16, 64, 100, 32, 64, 4

    def loss(emb, w, b, wd, ids, y):
        x = dq.transpose(dq.take(emb, ids, axis=0), (0, 2, 1))  # (B, D, T)
        h = dq.relu(dq.conv1d(x, w, padding=1) + dq.reshape(b, (1, -1, 1)))
        return dq.mean(dq.softmax_cross_entropy(dq.max(h, axis=2) @ wd, y))

    ids = rng.integers(0, V, (B, T)).astype(np.int32)
    args = (f32(V, D, scale=0.3), f32(F, D, 3, scale=(3 * D) ** -0.5), f32(F, scale=0.1))
    args += (f32(F, K, scale=F**-0.5), ids, _onehot(B, K))
    return f"conv1d text classifier, batch {B}, {T} tokens, vocab {V}", loss, args, (0, 1, 2, 3)


def _causal(s, T):
    import dlvm_eq as dq

    return dq.where(np.tril(np.ones((T, T), bool)), s, -1e9)


def causal_attention():
    import dlvm_eq as dq

    B, T, D = 8, 64, 32

    def loss(wq, wk, wv, wo, x, y):
        q, k, v = x @ wq, x @ wk, x @ wv
        s = _causal(q @ dq.transpose(k, (0, 2, 1)) / math.sqrt(D), T)
        return dq.mean(dq.square((dq.softmax(s, axis=-1) @ v) @ wo - y))

    ws = [f32(D, D, scale=D**-0.5) for _ in range(4)]
    return (
        f"causal attention, batch {B}, seq {T}, d {D}",
        loss,
        (*ws, f32(B, T, D), f32(B, T, D)),
        (
            0,
            1,
            2,
            3,
        ),
    )


def tied_lm():
    """The issue's shape: batch 16, seq 32, d 32; `take` for the input embedding, `x @ E.T` for
    the logits, causal attention."""
    import dlvm_eq as dq

    B, T, D, V = 16, 32, 32, 64

    def loss(E, wq, wk, wv, wo, ids, y):
        x = dq.take(E, ids, axis=0)
        q, k, v = x @ wq, x @ wk, x @ wv
        s = _causal(q @ dq.transpose(k, (0, 2, 1)) / math.sqrt(D), T)
        h = x + (dq.softmax(s, axis=-1) @ v) @ wo
        return dq.mean(dq.softmax_cross_entropy(h @ E.T, y))

    ids = rng.integers(0, V, (B, T)).astype(np.int32)
    y = np.eye(V, dtype=np.float32)[rng.integers(0, V, (B, T))]
    ws = [f32(D, D, scale=D**-0.5) for _ in range(4)]
    title = f"attention LM, tied embeddings, batch {B}, seq {T}, d {D}, vocab {V}"
    return title, loss, (f32(V, D, scale=0.1), *ws, ids, y), (0, 1, 2, 3, 4)


def _gru(name, steps):
    def model():
        import dlvm_eq as dq

        B, X, H = 16, 16, 32

        def loss(wx, wh, b, wo, y, *xs):
            h = np.zeros((B, H), np.float32)
            for x in xs:
                gx, gh = x @ wx + b, h @ wh
                z = dq.sigmoid(gx[:, :H] + gh[:, :H])
                r = dq.sigmoid(gx[:, H : 2 * H] + gh[:, H : 2 * H])
                n = dq.tanh(gx[:, 2 * H :] + r * gh[:, 2 * H :])
                h = (1.0 - z) * n + z * h
            return dq.mean(dq.square(h @ wo - y))

        args = (f32(X, 3 * H, scale=0.25), f32(H, 3 * H, scale=0.18), f32(3 * H, scale=0.1))
        args += (f32(H, 1, scale=0.2), f32(B, 1), *[f32(B, X) for _ in range(steps)])
        return f"GRU, {steps} steps, batch {B}, hidden {H}", loss, args, (0, 1, 2, 3)

    model.__name__ = name
    return model


def vae():
    import dlvm_eq as dq

    B, X, H, Z = 128, 256, 128, 16

    def loss(w1, b1, wm, wv, w2, b2, w3, b3, x, eps):
        h = dq.relu(x @ w1 + b1)
        mu, logvar = h @ wm, h @ wv
        z = mu + dq.exp(0.5 * logvar) * eps
        p = dq.sigmoid(dq.relu(z @ w2 + b2) @ w3 + b3)
        bce = -dq.sum(x * dq.log(p + 1e-6) + (1.0 - x) * dq.log(1.0 - p + 1e-6)) / B
        kl = -0.5 * dq.sum(1.0 + logvar - mu * mu - dq.exp(logvar)) / B
        return bce + kl

    args = (f32(X, H, scale=X**-0.5), f32(H, scale=0.1), f32(H, Z, scale=H**-0.5))
    args += (f32(H, Z, scale=0.1 * H**-0.5), f32(Z, H, scale=Z**-0.5), f32(H, scale=0.1))
    args += (f32(H, X, scale=H**-0.5), f32(X, scale=0.1))
    args += (rng.random((B, X), dtype=np.float32), f32(B, Z))
    return f"VAE {X}-{H}-{Z}, batch {B}", loss, args, tuple(range(8))


def bilinear():
    import dlvm_eq as dq

    B, I, J, O = 64, 32, 32, 16

    def loss(w, b, x, u, y):
        return dq.mean(dq.square(dq.einsum("bi,oij,bj->bo", x, w, u) + b - y))

    args = (f32(O, I, J, scale=(I * J) ** -0.5), f32(O, scale=0.1), f32(B, I), f32(B, J))
    return f"einsum bilinear, batch {B}, {I}x{J} -> {O}", loss, (*args, f32(B, O)), (0, 1)


def pooling():
    import dlvm_eq as dq

    B, C, S = 16, 16, 16

    def loss(w, b, wd, x, y):
        h = dq.relu(dq.conv2d(x, w, padding=1) + _bias4(b))
        h = dq.avg_pool2d(dq.max_pool2d(h, 2), 2)
        return dq.mean(dq.softmax_cross_entropy(dq.reshape(h, (B, -1)) @ wd, y))

    flat = C * (S // 4) ** 2
    args = (f32(C, 3, 3, 3, scale=0.27), f32(C, scale=0.1), f32(flat, 10, scale=flat**-0.5))
    return (
        f"conv, max pool, avg pool, batch {B}, {C}x{S}x{S}",
        loss,
        (
            *args,
            f32(B, 3, S, S),
            _onehot(B, 10),
        ),
        (0, 1, 2),
    )


ORDINARY = [
    _resnet("resnet_small", 8, 16, 16),
    _resnet("resnet_large", 8, 32, 24),
    _dwsep("dwsep_small", 8, 16, 16),
    _dwsep("dwsep_large", 8, 64, 16),
    text_conv1d,
    causal_attention,
    tied_lm,
    _gru("gru_6", 6),
    _gru("gru_32", 32),
    vae,
    bilinear,
    pooling,
]
