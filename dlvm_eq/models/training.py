"""What the bundled demos share: the digits data, a progress bar on stderr, the loss curve as a
sparkline or a matplotlib plot, a median step time, and one training loop over batches.

    x_train, x_test, y_train, y_test = load_digits_split(seed=0)
    step, state, seconds = compiled_step(loss, params, optimizer, "Adam", first_batch,
                                         pipeline, target, say)
    batches = shuffled_batches(rows, batch, seed, take)      # take(indices) -> data arguments
    params, state, losses = fit(step, params, state, batches, epochs, say)
"""

from __future__ import annotations

import sys
import time

import numpy as np


def load_digits_split(seed: int = 0):
    """Digits scaled to [0, 1], one-hot labels, a 75/25 split (no download: sklearn bundles it)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    return train_test_split(x, d.target, test_size=0.25, random_state=seed, stratify=d.target)


def one_hot(labels, n=10):
    return np.eye(n, dtype=np.float32)[labels]


class ProgressBar:
    """A one-line progress bar on stderr (no dependency; silent when stderr is not a terminal)."""

    def __init__(self, total: int, width: int = 30, stream=None):
        self.total, self.width = total, width
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()

    def update(self, done: int, text: str = ""):
        if not self.live:
            return
        fill = int(self.width * done / self.total)
        self.stream.write(
            f"\r  [{'#' * fill}{'.' * (self.width - fill)}] {done}/{self.total} {text}"
        )
        self.stream.flush()

    def close(self):
        if self.live:
            self.stream.write("\n")


def median_ms(fn, repeats: int = 30) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def sparkline(values, width: int = 60) -> str:
    bars = "▁▂▃▄▅▆▇█"
    v = np.asarray(values)
    idx = np.linspace(0, len(v) - 1, min(width, len(v))).astype(int)
    v = v[idx]
    lo, hi = float(v.min()), float(v.max())
    scale = (v - lo) / (hi - lo + 1e-12)
    return "".join(bars[int(round(s * (len(bars) - 1)))] for s in scale)


def plot_losses(losses, path: str, title: str, say) -> None:
    """The per-epoch loss curve as a PNG (matplotlib, from the `bench` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say(f"--plot: matplotlib is not installed; {path} not written")
        return
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(range(1, len(losses) + 1), losses)
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    say(f"loss curve written to {path}")


def fit(step, params, state, batches, epochs: int, say):
    """Train: `step(params, state, *batch) -> (loss, params, state)` over `batches(epoch)` (an
    iterable of argument tuples) for `epochs`; a progress bar, then the loss curve.
    Returns (params, state, per-epoch mean losses)."""
    losses = []
    bar = ProgressBar(epochs)
    for epoch in range(epochs):
        total, n = 0.0, 0
        for batch in batches(epoch):
            value, params, state = step(params, state, *batch)
            total += float(value)
            n += 1
        losses.append(total / max(n, 1))
        bar.update(epoch + 1, f"loss {losses[-1]:.4f}")
    bar.close()
    say("\nloss curve (per epoch):")
    say(f"  {losses[0]:.4f} {sparkline(losses)} {losses[-1]:.4f}")
    return params, state, losses


def train_step(loss, optimizer, pipeline, target: str = "cpu"):
    """The jitted step `(params, state, *data) -> (loss, params, state)`: value and gradient of
    `loss(params, *data)` and the optimizer's update, all inside one function compiled for
    `target`."""
    value_and_grad = pipeline.value_and_grad(loss)

    def step(params, state, *data):
        value, grads = value_and_grad(params, *data)
        params, state = optimizer.update(grads, state, params)
        return value, params, state

    step.__name__ = f"{getattr(loss, '__name__', 'loss')}_train_step"
    return pipeline.jit(step, target=target)


def compiled_step(loss, params, optimizer, name: str, first_batch, pipeline, target: str, say):
    """(the jitted training step, the optimizer's initial state, seconds to compile it): the
    step is compiled by one call on `first_batch`, whose result is dropped."""
    state = optimizer.init(params)
    step = train_step(loss, optimizer, pipeline, target)
    t0 = time.perf_counter()
    step(params, state, *first_batch)
    seconds = time.perf_counter() - t0
    say(f"\ncompiled the training step (value, gradient, {name}) in {seconds:.2f} s")
    return step, state, seconds


def shuffled_batches(rows: int, batch: int, seed: int, take):
    """`batches(epoch)` for `fit`: each epoch a new permutation of `rows` rows cut into full
    batches, each batch `take(indices)` (a tuple of the step's data arguments)."""
    rng = np.random.default_rng(seed)

    def batches(epoch):
        order = rng.permutation(rows)
        for i in range(rows // batch):
            yield take(order[i * batch : (i + 1) * batch])

    return batches
