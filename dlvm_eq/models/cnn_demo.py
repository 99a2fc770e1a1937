"""`dlvm-eq demo --model cnn`: a convolutional classifier (models/cnn.py) trained on
scikit-learn's 8x8 digits through the compiler: conv2d, max-pool and dense layers in the DSL, the
adjoint in the e-graph, im2col + GEMM window steps, Adam inside the jitted step.

`--dropout RATE` drops the dense layer's inputs during training, with a key that the jitted step
splits and carries in its state; `--batch-norm` normalizes after each convolution, by the
batch's statistics in training and by the running statistics (carried in the same state, a
pytree) at test time.
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


def regularized_step(optimizer, rate: float, target: str):
    """The jitted step `(params, state, x, onehot) -> (loss, params, state)` of cnn.train_loss,
    where state is {"opt": the optimizer's, "norm": running statistics or None, "key": the
    random key, split every step}."""

    def train_loss(params, norm, x, onehot, key):  # the rate a constant, not a traced input
        return cnn.train_loss(params, norm, x, onehot, key, rate)

    value_and_grad = pipeline.value_and_grad(train_loss, has_aux=True)

    def cnn_regularized_step(params, state, x, onehot):
        key, use = dsl.random.split(state["key"])
        (value, norm), grads = value_and_grad(params, state["norm"], x, onehot, use)
        params, opt = optimizer.update(grads, state["opt"], params)
        return value, params, {"opt": opt, "norm": norm, "key": key}

    return pipeline.jit(cnn_regularized_step, target=target)


def run(
    target: str = "cpu",
    epochs: int = EPOCHS,
    plot: str | None = None,
    seed: int = 0,
    out=None,
    dropout: float = 0.0,
    batch_norm: bool = False,
) -> dict:
    out = out or sys.stdout  # read at the call: a caller may have replaced sys.stdout

    def say(*a):
        print(*a, file=out, flush=True)

    x_train, x_test, y_train, y_test = load_digits_split(seed)
    x_train, x_test = x_train.reshape(-1, 1, 8, 8), x_test.reshape(-1, 1, 8, 8)
    c1, c2 = cnn.CHANNELS
    norm_text = " + batch norm" if batch_norm else ""
    say(
        f"dlvm_eq demo: CNN (conv3x3 {c1}{norm_text}, ReLU, max-pool 2, conv3x3 {c2}{norm_text}, "
        f"ReLU, max-pool 2, {f'dropout {dropout}, ' if dropout else ''}dense 10) on the digits "
        f"data set ({len(x_train)} train / {len(x_test)} test), Adam lr={LR}, batch {BATCH}, "
        f"target {target}"
    )
    params = cnn.init_params(seed=seed, batch_norm=batch_norm)
    optimizer = dsl.optim.adam(LR)
    first = (x_train[:BATCH], one_hot(y_train[:BATCH]))
    if dropout or batch_norm:
        norm = cnn.norm_state() if batch_norm else None
        state = {"opt": optimizer.init(params), "norm": norm, "key": dsl.random.key(seed)}
        step = regularized_step(optimizer, dropout, target)
        compile_s = _compile(step, params, state, first, say)
    else:
        step, state, compile_s = compiled_step(
            cnn.loss, params, optimizer, "Adam", first, pipeline, target, say
        )
    batches = shuffled_batches(
        len(x_train), BATCH, seed, lambda idx: (x_train[idx], one_hot(y_train[idx]))
    )
    params, state, losses = fit(step, params, state, batches, epochs, say)
    norm = state["norm"] if batch_norm else None
    logits = pipeline.jit(cnn.logits, target=target)
    acc = float(np.mean(np.argmax(logits(params, x_test, norm), axis=1) == y_test))
    say(f"test accuracy: {100 * acc:.1f}%")
    if plot:
        plot_losses(losses, plot, "dlvm_eq: CNN on digits", say)
    return {"accuracy": acc, "losses": losses, "compile_s": compile_s, "state": state}


def _compile(step, params, state, first, say) -> float:
    import time

    t0 = time.perf_counter()
    step(params, state, *first)
    seconds = time.perf_counter() - t0
    say(f"\ncompiled the training step (value, gradient, Adam, random key) in {seconds:.2f} s")
    return seconds
