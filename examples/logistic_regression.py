"""Logistic regression trained with `dq.jit(dq.value_and_grad(loss))` and SGD.

    python examples/logistic_regression.py

Prints what the optimizer changed in the loss and in its gradient program, then trains.
"""

import numpy as np
from _support import jit_value_and_grad, raw_gradient, show_optimization

import dlvm_eq as dq


def loss(w, b, x, y):
    """Mean binary cross-entropy of sigmoid(x @ w + b), written stably as softplus(z) - y z."""
    z = x @ w + b
    return dq.mean(dq.softplus(z) - y * z)


def main(steps: int = 50, lr: float = 0.5):
    rng = np.random.default_rng(0)
    n, d = 512, 20
    x = rng.standard_normal((n, d)).astype(np.float32)
    true_w = rng.standard_normal(d).astype(np.float32)
    y = (x @ true_w + 0.3 * rng.standard_normal(n) > 0).astype(np.float32)
    w, b = np.zeros(d, np.float32), np.zeros((), np.float32)
    args = (w, b, x, y)

    print(dq.make_ir(loss)(*args))
    show_optimization("forward: dq.optimize(dq.make_ir(loss)(...))", dq.make_ir(loss)(*args))
    show_optimization(
        "gradient wrt (w, b): adjoint rules alone -> dq.optimize",
        raw_gradient(loss, (0, 1), args),
        show_ir=True,
    )

    step, target = jit_value_and_grad(loss, (0, 1), args)
    print(f"\ntraining {steps} SGD steps on target {target!r}")
    for i in range(steps):
        value, (gw, gb) = step(w, b, x, y)
        w -= lr * gw
        b -= lr * gb
        if i % 10 == 0 or i == steps - 1:
            print(f"  step {i:3d}  loss {float(value):.4f}")
    accuracy = float(np.mean(((x @ w + b) > 0) == (y > 0.5)))
    print(f"train accuracy: {100 * accuracy:.1f}%")


if __name__ == "__main__":
    main()
