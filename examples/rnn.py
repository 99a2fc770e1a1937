"""An unrolled tanh RNN: a Python loop in the DSL unrolls into straight-line IR, and the
gradient with respect to the weights flows back through every step.

    python examples/rnn.py

h_1 = tanh(x_1 Wx + b),  h_t = tanh(x_t Wx + h_{t-1} Wh + b),  loss = mean((h_T Wo - y)^2)
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

STEPS, BATCH, FEATURES, HIDDEN = 8, 32, 4, 16


def loss(wx, wh, b, wo, y, *xs):
    h = dq.tanh(xs[0] @ wx + b)
    for x in xs[1:]:  # unrolled at trace time: one block of IR per step
        h = dq.tanh(x @ wx + h @ wh + b)
    return dq.mean(dq.square(h @ wo - y))


def numpy_loss(wx, wh, b, wo, y, *xs):
    h = np.tanh(xs[0] @ wx + b)
    for x in xs[1:]:
        h = np.tanh(x @ wx + h @ wh + b)
    return np.mean(np.square(h @ wo - y))


def main(train_steps: int = 40, lr: float = 0.2):
    rng = np.random.default_rng(0)
    f32 = lambda *shape: (0.4 * rng.standard_normal(shape)).astype(np.float32)
    xs, y = sequence_task(rng, BATCH, FEATURES, STEPS)  # learn the mean of feature 0
    params = [
        f32(FEATURES, HIDDEN),
        f32(HIDDEN, HIDDEN),
        np.zeros(HIDDEN, np.float32),
        f32(HIDDEN, 1),
    ]
    args = (*params, y, *xs)
    argnums = (0, 1, 2, 3)

    forward = dq.make_ir(loss)(*args)
    print(
        f"{STEPS} time steps unrolled into {len(forward.functions['loss'].body)} IR instructions "
        f"({sum(i.op == 'tanh' for i in forward.functions['loss'].body)} tanh)"
    )
    show_optimization("forward: dq.optimize(dq.make_ir(loss)(...))", forward)
    show_optimization(
        "gradient wrt wx, wh, b, wo: adjoint rules alone -> dq.optimize",
        raw_gradient(loss, argnums, args),
    )

    step, target = jit_value_and_grad(loss, argnums, args)
    _, grads = step(*args)
    check_gradients(("wx", "wh", "b", "wo"), grads, numpy_loss, args, rng)
    train(step, params, (y, *xs), train_steps, lr, target)


if __name__ == "__main__":
    main()
