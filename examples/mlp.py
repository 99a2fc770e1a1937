"""A ReLU MLP classifier (dlvm_eq.models.mlp.loss) trained for a few SGD steps on random data.

    python examples/mlp.py

Prints what the optimizer changed in the gradient program, trains, and checks the compiled
gradient against the hand-written numpy backward pass.
"""

import inspect

import numpy as np
from _support import jit_value_and_grad, raw_gradient, show_optimization

import dlvm_eq as dq
from dlvm_eq.models import mlp


def main(steps: int = 30, lr: float = 0.1):
    rng = np.random.default_rng(0)
    batch, sizes = 128, [64, 128, 10]
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    labels = rng.integers(0, sizes[-1], batch)
    onehot = np.eye(sizes[-1], dtype=np.float32)[labels]
    params = mlp.init_params(sizes, seed=0)
    args = (*params, x, onehot)
    argnums = (0, 1, 2, 3)

    print(inspect.getsource(mlp.loss))
    show_optimization("forward: dq.optimize(dq.make_ir(loss)(...))", dq.make_ir(mlp.loss)(*args))
    show_optimization(
        "gradient wrt w1, b1, w2, b2: adjoint rules alone -> dq.optimize",
        raw_gradient(mlp.loss, argnums, args),
    )

    step, target = jit_value_and_grad(mlp.loss, argnums, args)
    value, grads = step(*args)
    ref_value, ref_grads = mlp.numpy_value_and_grad(*args)
    worst = max(
        float(np.max(np.abs(g - r)) / (np.max(np.abs(r)) + 1e-30)) for g, r in zip(grads, ref_grads)
    )
    print(
        f"\ncompiled gradient vs hand-written numpy: loss {float(value):.6f} vs {ref_value:.6f}, "
        f"largest relative difference {worst:.1e}"
    )
    assert worst < 1e-4, "the compiled gradient disagrees with the hand-written one"

    print(
        f"training {steps} SGD steps (batch {batch}, {sizes[0]} -> {sizes[1]} -> {sizes[2]}) "
        f"on target {target!r}"
    )
    for i in range(steps):
        value, grads = step(*params, x, onehot)
        mlp.sgd(params, grads, lr)
        if i % 10 == 0 or i == steps - 1:
            print(f"  step {i:3d}  loss {float(value):.4f}")
    print(f"train accuracy: {100 * mlp.accuracy(params, x, labels):.1f}%")


if __name__ == "__main__":
    main()
