"""`dlvm-eq demo --model transformer`: a 2-layer transformer encoder (models/transformer.py)
learns to sort sequences of digits, through the compiler: token and position embeddings by
`take`, multi-head attention by batched matmuls, layer norm, GELU, Adam inside the jitted step.
Token accuracy is measured on held-out sequences the model never saw.
"""

from __future__ import annotations

import sys

import numpy as np

from .. import dsl, pipeline
from . import transformer as tf
from .training import compiled_step, fit, plot_losses, shuffled_batches

BATCH = 128
EPOCHS = 3
TRAIN, HELD_OUT = 20_000, 2_000
LR = 2e-3


def run(
    target: str = "cpu",
    epochs: int = EPOCHS,
    plot: str | None = None,
    seed: int = 0,
    out=None,
    train_size: int = TRAIN,
) -> dict:
    out = out or sys.stdout  # read at the call: a caller may have replaced sys.stdout

    def say(*a):
        print(*a, file=out, flush=True)

    x, y = tf.sorting_task(train_size, seed=seed + 1)
    x_test, y_test = tf.sorting_task(HELD_OUT, seed=seed + 2)
    eye = np.eye(tf.VOCAB, dtype=np.float32)
    say(
        f"dlvm_eq demo: transformer encoder ({tf.LAYERS} layers, d_model {tf.D_MODEL}, {tf.HEADS} "
        f"heads, MLP {tf.MLP}) sorting sequences of {tf.SEQ} digits ({train_size} train / "
        f"{HELD_OUT} held out), Adam lr={LR}, batch {BATCH}, target {target}"
    )
    params = tf.init_params(seed=seed)
    step, state, compile_s = compiled_step(
        tf.loss,
        params,
        dsl.optim.adam(LR),
        "Adam",
        (x[:BATCH], eye[y[:BATCH]]),
        pipeline,
        target,
        say,
    )
    batches = shuffled_batches(len(x), BATCH, seed, lambda idx: (x[idx], eye[y[idx]]))
    params, state, losses = fit(step, params, state, batches, epochs, say)
    encode = pipeline.jit(tf.encode, target=target)
    predicted = np.argmax(encode(params, x_test), axis=-1)
    acc = float(np.mean(predicted == y_test))
    say(
        f"held-out token accuracy: {100 * acc:.2f}%; sequences sorted exactly: "
        f"{100 * float(np.mean(np.all(predicted == y_test, axis=1))):.1f}%"
    )
    if plot:
        plot_losses(losses, plot, "dlvm_eq: transformer sorting digits", say)
    return {"accuracy": acc, "losses": losses, "compile_s": compile_s}
