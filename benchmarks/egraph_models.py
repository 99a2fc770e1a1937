"""The models of benchmarks/egraph_value.py: the first eight (an MLP, attention, ..., a badly
associated chain), then the ordinary ones of issue 36 (`ORDINARY`: training steps written as a
user would write them, not tuned to this compiler). Each returns (title, loss, args, argnums);
`build` makes its value-and-gradient program with the algebra off or on.

    from egraph_models import MODELS, build
    title, module, fname, args = build(MODELS[0], algebra=True)

No side effects at import (tests/test_cost_ranking.py imports it).
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


def mlp():
    from dlvm_eq.models import mlp as m

    params = m.init_params([784, 256, 10], seed=0)
    x = rng.random((256, 784), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
    return "MLP 784-256-10, batch 256", m.loss, (*params, x, y), (0, 1, 2, 3)


def _softmax_rows(s):
    import dlvm_eq as dq

    e = dq.exp(s - dq.max(s, axis=1, keepdims=True))
    return e / dq.sum(e, axis=1, keepdims=True)


def attention():
    import dlvm_eq as dq

    T, D = 128, 64

    def loss(wq, wk, wv, wo, x, y):
        q, k, v = x @ wq, x @ wk, x @ wv
        p = _softmax_rows((q @ dq.transpose(k)) * (1.0 / math.sqrt(D)))
        return dq.mean(dq.square((p @ v) @ wo - y))

    ws = [f32(D, D, scale=D**-0.5) for _ in range(4)]
    return f"attention block, seq {T}, d {D}", loss, (*ws, f32(T, D), f32(T, D)), (0, 1, 2, 3)


def _layer_norm(h):
    import dlvm_eq as dq

    mu = dq.mean(h, axis=1, keepdims=True)
    c = h - mu
    return c / dq.sqrt(dq.mean(c * c, axis=1, keepdims=True) + 1e-5)


def _gelu(h):
    import dlvm_eq as dq

    return 0.5 * h * (1.0 + dq.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))


def transformer():
    import dlvm_eq as dq

    T, D, F = 128, 64, 256

    def loss(wq, wk, wv, wo, w1, w2, x, y):
        q, k, v = x @ wq, x @ wk, x @ wv
        p = _softmax_rows((q @ dq.transpose(k)) * (1.0 / math.sqrt(D)))
        h = _layer_norm(x + (p @ v) @ wo)
        out = _layer_norm(h + _gelu(h @ w1) @ w2)
        return dq.mean(dq.square(out - y))

    ws = [f32(D, D, scale=D**-0.5) for _ in range(4)] + [
        f32(D, F, scale=D**-0.5),
        f32(F, D, scale=F**-0.5),
    ]
    return (
        f"transformer encoder layer (1 head), seq {T}, d {D}, MLP {F}",
        loss,
        (*ws, f32(T, D), f32(T, D)),
        tuple(range(6)),
    )


def lstm():
    import dlvm_eq as dq

    STEPS, B, X, H = 8, 32, 16, 32

    def loss(w, b, wo, y, *xs):
        h = c = np.zeros((B, H), np.float32)
        for x in xs:
            z = dq.concatenate([x, h], axis=1) @ w + b
            i, f, o, g = z[:, :H], z[:, H : 2 * H], z[:, 2 * H : 3 * H], z[:, 3 * H :]
            c = dq.sigmoid(f) * c + dq.sigmoid(i) * dq.tanh(g)
            h = dq.sigmoid(o) * dq.tanh(c)
        return dq.mean(dq.square(h @ wo - y))

    args = (
        f32(X + H, 4 * H, scale=0.2),
        f32(4 * H, scale=0.1),
        f32(H, 1, scale=0.3),
        f32(B, 1),
        *[f32(B, X) for _ in range(STEPS)],
    )
    return f"LSTM, {STEPS} steps, batch {B}, hidden {H}", loss, args, (0, 1, 2)


def matrix_factorization():
    import dlvm_eq as dq

    U, I, R = 512, 384, 32

    def loss(u, v, ratings, mask):
        err = (u @ dq.transpose(v) - ratings) * mask
        return dq.sum(err * err) / U + 0.01 * (dq.sum(u * u) + dq.sum(v * v))

    mask = (rng.random((U, I)) < 0.1).astype(np.float32)
    return (
        f"matrix factorization {U}x{I}, rank {R}",
        loss,
        (f32(U, R, scale=0.1), f32(I, R, scale=0.1), f32(U, I), mask),
        (0, 1),
    )


def logistic():
    import dlvm_eq as dq

    N, D = 1024, 128

    def loss(w, b, x, y):
        p = dq.sigmoid(x @ w + b)
        return -dq.mean(y * dq.log(p) + (1.0 - y) * dq.log(1.0 - p))

    y = (rng.random((N, 1)) < 0.5).astype(np.float32)
    return (
        f"logistic regression, log(sigmoid) as written, {N}x{D}",
        loss,
        (f32(D, 1, scale=0.05), f32(1), f32(N, D), y),
        (0, 1),
    )


def as_written():
    import dlvm_eq as dq

    N = 256

    def loss(a, b, c, d, x):
        t = dq.transpose(dq.transpose(a))  # a transpose of a transpose
        chain = ((t @ b) @ c) @ d  # (256x256)(256x256)(256x8)(8x1): badly associated
        return dq.sum(dq.square(chain - x)) + dq.sum(dq.transpose(dq.transpose(b)) * 0.0)

    return (
        f"as a user wrote it: redundant transposes, badly associated {N}-chain",
        loss,
        (f32(N, N, scale=N**-0.5), f32(N, N, scale=N**-0.5), f32(N, 8), f32(8, 1), f32(N, 1)),
        (0, 1),
    )


def cnn():
    from dlvm_eq.models import cnn as m

    B, IMAGE = 32, 16
    p = m.init_params(image=IMAGE, seed=0)
    names = ("c1", "b1", "c2", "b2", "w", "b")

    def loss(c1, b1, c2, b2, w, b, x, y):
        return m.loss(dict(zip(names, (c1, b1, c2, b2, w, b))), x, y)

    x = rng.random((B, 1, IMAGE, IMAGE), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, B)]
    return (
        f"CNN, batch {B}, 1x{IMAGE}x{IMAGE}: conv3x3 {m.CHANNELS[0]}, pool, conv3x3 {m.CHANNELS[1]}, "
        f"pool, dense 10",
        loss,
        (*(p[k] for k in names), x, y),
        tuple(range(6)),
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

MODELS = [mlp, attention, transformer, lstm, cnn, matrix_factorization, logistic, as_written]
MODELS += ORDINARY  # issue 36: ResNet blocks, depthwise-separable convs, GRUs, a VAE, ...
CONTRIVED = ("as_written",)  # left out of the ordinary models' geometric mean


def build(model, algebra: bool):
    """(title, module holding the value-and-gradient function, its name, args). With the
    algebra off, the adjoint is extracted without the algebra rules too: differentiation
    itself runs in the e-graph, and would otherwise already optimize the program."""
    import dlvm_eq as dq
    from dlvm_eq.ad import adjoint_function
    from dlvm_eq.ir.module import Module

    title, loss, args, argnums = model()
    # named through make_ir: renaming `loss` itself renamed dlvm_eq.models.mlp.loss for the
    # rest of the process (a test in the same pytest worker then traced a function "@mlp")
    forward = dq.make_ir(loss, name=model.__name__)(*args)[model.__name__]
    grad = adjoint_function(
        None,
        forward,
        wrt=argnums,
        keeping=(0,),
        tuple_result=True,
        optimize=algebra,
        name=f"{model.__name__}_step",
    )
    module = Module(grad.name)
    module.add(grad)
    return title, module, grad.name, args
