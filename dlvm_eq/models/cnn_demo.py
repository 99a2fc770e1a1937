"""`dlvm-eq demo --model cnn`: a convolutional classifier (models/cnn.py) trained on
scikit-learn's 8x8 digits through the compiler: conv2d, max-pool and dense layers in the DSL, the
adjoint in the e-graph, im2col + GEMM window steps, Adam inside the jitted step.
"""

from __future__ import annotations

import sys

import numpy as np

from .. import dsl, pipeline
from . import cnn
from .training import compiled_step, fit, load_digits_split, one_hot, plot_losses, shuffled_batches

BATCH = 64
EPOCHS = 25
LR = 2e-3


def run(
    target: str = "cpu", epochs: int = EPOCHS, plot: str | None = None, seed: int = 0, out=None
) -> dict:
    out = out or sys.stdout  # read at the call: a caller may have replaced sys.stdout

    def say(*a):
        print(*a, file=out, flush=True)

    x_train, x_test, y_train, y_test = load_digits_split(seed)
    x_train, x_test = x_train.reshape(-1, 1, 8, 8), x_test.reshape(-1, 1, 8, 8)
    c1, c2 = cnn.CHANNELS
    say(
        f"dlvm_eq demo: CNN (conv3x3 {c1}, ReLU, max-pool 2, conv3x3 {c2}, ReLU, max-pool 2, "
        f"dense 10) on the digits data set ({len(x_train)} train / {len(x_test)} test), "
        f"Adam lr={LR}, batch {BATCH}, target {target}"
    )
    params = cnn.init_params(seed=seed)
    step, state, compile_s = compiled_step(
        cnn.loss,
        params,
        dsl.optim.adam(LR),
        "Adam",
        (x_train[:BATCH], one_hot(y_train[:BATCH])),
        pipeline,
        target,
        say,
    )
    batches = shuffled_batches(
        len(x_train), BATCH, seed, lambda idx: (x_train[idx], one_hot(y_train[idx]))
    )
    params, state, losses = fit(step, params, state, batches, epochs, say)
    logits = pipeline.jit(cnn.logits, target=target)
    acc = float(np.mean(np.argmax(logits(params, x_test), axis=1) == y_test))
    say(f"test accuracy: {100 * acc:.1f}%")
    if plot:
        plot_losses(losses, plot, "dlvm_eq: CNN on digits", say)
    return {"accuracy": acc, "losses": losses, "compile_s": compile_s}
