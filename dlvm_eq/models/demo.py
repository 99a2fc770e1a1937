"""`dlvm-eq demo`: train an MLP on scikit-learn's bundled digits through the whole compiler.

Staged DSL -> adjoint in the e-graph -> algebra rules -> extraction -> fused kernels, then SGD.
Prints the compile report, the loss curve, the test accuracy and the step time against a
hand-written numpy step measured in the same run.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from . import mlp
from .training import ProgressBar, load_digits_split, median_ms, one_hot, plot_losses, sparkline

HIDDEN = 128
BATCH = 128
EPOCHS = 40
LR = 0.2


def run(
    target: str = "cpu",
    epochs: int = EPOCHS,
    plot: str | None = None,
    seed: int = 0,
    out=None,
    workers: int | None = None,
) -> dict:
    from .. import pipeline as dq  # jit and value_and_grad (not the root package: it sits above)

    out = out or sys.stdout  # read at the call: a caller may have replaced sys.stdout

    def say(*a):
        print(*a, file=out, flush=True)

    x_train, x_test, y_train, y_test = load_digits_split(seed)
    params = mlp.init_params([64, HIDDEN, 10], seed=seed)
    say(
        f"dlvm_eq demo: MLP 64 -> {HIDDEN} -> 10 (ReLU, softmax cross-entropy) on the digits "
        f"data set ({len(x_train)} train / {len(x_test)} test), SGD lr={LR}, batch {BATCH}, "
        f"target {target}"
    )

    # --- compile: trace, differentiate in the e-graph, optimize, generate kernels
    xb, yb = x_train[:BATCH], one_hot(y_train[:BATCH])
    argnums = (0, 1, 2, 3)
    t0 = time.perf_counter()
    step = dq.jit(dq.value_and_grad(mlp.loss, argnums=argnums), target=target)
    step(*params, xb, yb)
    compile_s = time.perf_counter() - t0
    say(f"\ncompiled value_and_grad(loss) in {compile_s * 1e3:.0f} ms")
    report = getattr(step, "report", None)
    if callable(report):
        report = report(*params, xb, yb)
    if report is not None:
        say(str(report))
    if workers is not None:  # the same step, data-parallel on a local Ray it starts and stops
        from ..distributed import data_parallel, start_local

        ray = start_local(num_cpus=workers)
        step = data_parallel(step, batch_argnums=(4, 5), workers=workers)
        say(f"training data-parallel on {workers} Ray worker(s), one compute thread each")

    # --- train
    n_batches = len(x_train) // BATCH
    rng = np.random.default_rng(seed)
    losses = []
    bar = ProgressBar(epochs)
    for epoch in range(epochs):
        order = rng.permutation(len(x_train))
        total = 0.0
        for i in range(n_batches):
            idx = order[i * BATCH : (i + 1) * BATCH]
            value, grads = step(*params, x_train[idx], one_hot(y_train[idx]))
            mlp.sgd(params, [np.asarray(g) for g in grads], LR)
            total += float(value)
        losses.append(total / n_batches)
        bar.update(epoch + 1, f"loss {losses[-1]:.4f}")
    bar.close()

    say("\nloss curve (per epoch):")
    say(f"  {losses[0]:.4f} {sparkline(losses)} {losses[-1]:.4f}")
    acc = mlp.accuracy(params, x_test, y_test)
    say(f"test accuracy: {100 * acc:.1f}%")

    # --- speed against the hand-written numpy step, same run, same batch
    ours = median_ms(lambda: step(*params, xb, yb))
    ref = median_ms(lambda: mlp.numpy_value_and_grad(*params, xb, yb))
    ours_name = "dlvm_eq" if workers is None else f"dlvm_eq on {workers} Ray worker(s)"
    say(
        f"\nstep time (batch {BATCH}, median): {ours_name} {ours:.3f} ms, numpy hand-written "
        f"{ref:.3f} ms -> {ref / ours:.2f}x"
    )
    if workers is not None:
        ray.shutdown()

    if plot:
        plot_losses(losses, plot, "dlvm_eq: MLP on digits", say)
    return {
        "accuracy": acc,
        "losses": losses,
        "step_ms": ours,
        "numpy_ms": ref,
        "compile_s": compile_s,
    }
