"""`dlvm-eq demo --model rnn`: a GRU (models/rnn.py) trained on scikit-learn's 8x8 digits read as
a sequence through `dq.scan`: rows as steps (8 steps of 8 pixels; `--sequence pixels`: 64 steps
of one pixel, the harder setting), Adam inside the jitted step; the scan's body is compiled once
and runs on the native loop driver on the cpu (pipeline/loops.py).
"""

from __future__ import annotations

import sys

import numpy as np

from .. import dsl, pipeline
from . import rnn
from .training import compiled_step, fit, load_digits_split, one_hot, plot_losses, shuffled_batches

BATCH = 64
EPOCHS = 30
LR = 1e-2


def run(
    target: str = "cpu",
    epochs: int = EPOCHS,
    plot: str | None = None,
    seed: int = 0,
    out=None,
    sequence: str = "rows",
) -> dict:
    out = out or sys.stdout  # read at the call: a caller may have replaced sys.stdout

    def say(*a):
        print(*a, file=out, flush=True)

    x_train, x_test, y_train, y_test = load_digits_split(seed)
    xs_train, xs_test = rnn.as_sequence(x_train, sequence), rnn.as_sequence(x_test, sequence)
    steps, _, inputs = xs_train.shape
    say(
        f"dlvm_eq demo: GRU ({inputs} inputs, hidden {rnn.HIDDEN}, dense 10) over the digits "
        f"read {'row by row' if sequence == 'rows' else 'pixel by pixel'} ({steps} steps; "
        f"{len(x_train)} train / {len(x_test)} test) through dq.scan, Adam lr={LR}, "
        f"batch {BATCH}, target {target}"
    )
    params = rnn.init_params(inputs=inputs, seed=seed)
    step, state, compile_s = compiled_step(
        rnn.loss,
        params,
        dsl.optim.adam(LR),
        "Adam",
        (xs_train[:, :BATCH], one_hot(y_train[:BATCH])),
        pipeline,
        target,
        say,
    )
    batches = shuffled_batches(
        len(x_train), BATCH, seed, lambda idx: (xs_train[:, idx], one_hot(y_train[idx]))
    )
    params, state, losses = fit(step, params, state, batches, epochs, say)
    logits = pipeline.jit(rnn.logits, target=target)
    acc = float(np.mean(np.argmax(logits(params, xs_test), axis=1) == y_test))
    say(f"test accuracy: {100 * acc:.1f}%")
    if plot:
        plot_losses(losses, plot, f"dlvm_eq: GRU on digits ({sequence} as steps)", say)
    return {"accuracy": acc, "losses": losses, "compile_s": compile_s}
