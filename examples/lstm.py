"""An unrolled LSTM: one matmul per step computes all four gates (4H columns), sliced apart
with numpy indexing (`z[:, :H]`, ... as IR `slice` ops); the gradient pads each gate's adjoint
back into place, and the optimizer joins the padded pieces into one concatenation.

    python examples/lstm.py

z_t = [x_t, h_{t-1}] W + b;  i, f, o, g = split(z_t, 4);  c_t = sigmoid(f) c_{t-1} + sigmoid(i) tanh(g)
h_t = sigmoid(o) tanh(c_t);  loss = mean((h_T Wo - y)^2)
"""

import numpy as np
from _support import (
    check_gradients,
    jit_value_and_grad,
    raw_gradient,
    sequence_task,
    show_optimization,
    train,
)

import dlvm_eq as dq

STEPS, BATCH, FEATURES, HIDDEN = 6, 32, 4, 8


def loss(w, b, wo, y, *xs):
    H = HIDDEN
    h = c = np.zeros((BATCH, H), np.float32)
    for x in xs:  # unrolled at trace time
        z = dq.concatenate([x, h], axis=1) @ w + b
        i, f, o, g = z[:, :H], z[:, H : 2 * H], z[:, 2 * H : 3 * H], z[:, 3 * H :]
        c = dq.sigmoid(f) * c + dq.sigmoid(i) * dq.tanh(g)
        h = dq.sigmoid(o) * dq.tanh(c)
    return dq.mean(dq.square(h @ wo - y))


def numpy_loss(w, b, wo, y, *xs):
    sig = lambda v: 1 / (1 + np.exp(-v))
    H = HIDDEN
    h = c = np.zeros((BATCH, H))
    for x in xs:
        z = np.concatenate([x, h], axis=1) @ w + b
        i, f, o, g = np.split(z, 4, axis=1)
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
    return np.mean(np.square(h @ wo - y))


def main(train_steps: int = 40, lr: float = 0.5):
    rng = np.random.default_rng(0)
    f32 = lambda *shape: (0.4 * rng.standard_normal(shape)).astype(np.float32)
    xs, y = sequence_task(rng, BATCH, FEATURES, STEPS)  # learn the mean of feature 0
    params = [f32(FEATURES + HIDDEN, 4 * HIDDEN), np.zeros(4 * HIDDEN, np.float32), f32(HIDDEN, 1)]
    args = (*params, y, *xs)
    argnums = (0, 1, 2)

    forward = dq.make_ir(loss)(*args)
    body = forward.functions["loss"].body
    print(
        f"{STEPS} time steps unrolled into {len(body)} IR instructions "
        f"({sum(i.op == 'slice' for i in body)} slices, {sum(i.op == 'dot' for i in body)} dot)"
    )
    show_optimization("forward: dq.optimize(dq.make_ir(loss)(...))", forward)
    show_optimization(
        "gradient wrt w, b, wo: adjoint rules alone -> dq.optimize",
        raw_gradient(loss, argnums, args),
    )

    step, target = jit_value_and_grad(loss, argnums, args)
    _, grads = step(*args)
    check_gradients(("w", "b", "wo"), grads, numpy_loss, args, rng)
    train(step, params, (y, *xs), train_steps, lr, target)


if __name__ == "__main__":
    main()
