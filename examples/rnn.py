"""An unrolled tanh RNN: a Python loop in the DSL unrolls into straight-line IR, and the
gradient with respect to the weights flows back through every step.

    python examples/rnn.py

h_1 = tanh(x_1 Wx + b),  h_t = tanh(x_t Wx + h_{t-1} Wh + b),  loss = mean((h_T Wo - y)^2)
"""
import numpy as np

import dlvm_eq as dq
from _support import jit_value_and_grad, raw_gradient, show_optimization

STEPS, BATCH, FEATURES, HIDDEN = 8, 32, 4, 16


def loss(wx, wh, b, wo, y, *xs):
    h = dq.tanh(xs[0] @ wx + b)
    for x in xs[1:]:                       # unrolled at trace time: one block of IR per step
        h = dq.tanh(x @ wx + h @ wh + b)
    return dq.mean(dq.square(h @ wo - y))


def numpy_loss(wx, wh, b, wo, y, *xs):
    h = np.tanh(xs[0] @ wx + b)
    for x in xs[1:]:
        h = np.tanh(x @ wx + h @ wh + b)
    return np.mean(np.square(h @ wo - y))


def central_difference(f, args, i, direction, eps=1e-3):
    """d/dt f(args[i] + t*direction) at 0, in float64."""
    args64 = [np.asarray(a, np.float64) for a in args]
    plus, minus = list(args64), list(args64)
    plus[i] = args64[i] + eps * direction
    minus[i] = args64[i] - eps * direction
    return (f(*plus) - f(*minus)) / (2 * eps)


def main(train_steps: int = 40, lr: float = 0.2):
    rng = np.random.default_rng(0)
    f32 = lambda *shape: (0.4 * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
    xs = [f32(BATCH, FEATURES) for _ in range(STEPS)]
    y = np.sum([x[:, :1] for x in xs], axis=0) / STEPS      # learn the mean of feature 0
    params = [f32(FEATURES, HIDDEN), f32(HIDDEN, HIDDEN), np.zeros(HIDDEN, np.float32),
              f32(HIDDEN, 1)]
    args = (*params, y, *xs)
    argnums = (0, 1, 2, 3)

    forward = dq.make_ir(loss)(*args)
    print(f"{STEPS} time steps unrolled into {len(forward.functions['loss'].body)} IR instructions "
          f"({sum(i.op == 'tanh' for i in forward.functions['loss'].body)} tanh)")
    show_optimization("forward: dq.optimize(dq.make_ir(loss)(...))", forward)
    show_optimization("gradient wrt wx, wh, b, wo: adjoint rules alone -> dq.optimize",
                      raw_gradient(loss, argnums, args))

    step, target = jit_value_and_grad(loss, argnums, args)
    value, grads = step(*args)
    names = ("wx", "wh", "b", "wo")
    print("\ngradient check (directional derivative, central differences in float64):")
    for i, (name, g) in enumerate(zip(names, grads)):
        direction = rng.standard_normal(g.shape)
        expected = central_difference(numpy_loss, args, i, direction)
        got = float(np.sum(g * direction))
        print(f"  d loss / d {name:2s}: compiled {got:+.6f}  finite differences {expected:+.6f}")
        assert abs(got - expected) <= 1e-3 * max(1.0, abs(expected)), name

    print(f"training {train_steps} SGD steps on target {target!r}")
    for i in range(train_steps):
        value, grads = step(*params, y, *xs)
        for p, g in zip(params, grads):
            p -= lr * g
        if i % 10 == 0 or i == train_steps - 1:
            print(f"  step {i:3d}  loss {float(value):.5f}")


if __name__ == "__main__":
    main()
