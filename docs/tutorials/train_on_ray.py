"""Tutorial: train on Ray, data-parallel, with the single-process step's numbers.

Run from the repository root: `python docs/tutorials/train_on_ray.py` (needs Ray:
`pip install -e '.[distributed]'`). Every claim the page (docs/tutorials/ray.md) makes is an
assert below; tests/test_tutorials.py runs it.
"""

from __future__ import annotations

import numpy as np

import dlvm_eq as dq
from dlvm_eq.distributed import data_parallel, start_local, train


def make_loss():
    """The loss, defined in a function so that Ray sends it to the workers by value (a loss in
    a module of your own must be importable on every worker instead)."""

    def loss(params, x, y):
        h = dq.tanh(x @ params["w1"] + params["b1"])
        return dq.mean(dq.softmax_cross_entropy(h @ params["w2"], y))  # a mean over rows

    return loss


def main() -> None:
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.standard_normal((8, 16)) * 0.3,
        "b1": np.zeros(16),
        "w2": rng.standard_normal((16, 3)) * 0.3,
    }
    labels = rng.integers(0, 3, 60)
    x = rng.standard_normal((60, 8)) + labels[:, None]  # three separable clusters
    y = np.eye(3)[labels]
    loss = make_loss()

    # 1. A local Ray with two CPUs (on a cluster: ray.init(address="auto") instead).
    ray = start_local(num_cpus=2)
    try:
        # 2. Wrap the step: x and y (arguments 1 and 2) are split along axis 0 across two
        #    workers, each compiling the same program; the driver combines their outputs.
        step = data_parallel(dq.value_and_grad(loss), batch_argnums=(1, 2), workers=2)
        value, grads = step(params, x, y)

        # the single-process step's numbers on the whole batch
        value1, grads1 = dq.jit(dq.value_and_grad(loss))(params, x, y)
        print(f"loss on 2 workers {float(value):.12f}, in one process {float(value1):.12f}")
        assert np.allclose(value, value1, rtol=1e-12)
        for k in params:
            assert np.allclose(grads[k], grads1[k], rtol=1e-10, atol=1e-14), k

        # 3. Train: the optimizer runs on the driver; the workers get the parameters each step.
        batches = [(x[i : i + 20], y[i : i + 20]) for i in range(0, 60, 20)] * 10
        params, losses = train(step, params, batches, dq.optim.adam(0.05))
        print(f"loss over {len(losses)} steps: {losses[0]:.3f} -> {losses[-1]:.3f}")
        assert len(losses) == 30 and losses[-1] < 0.5 * losses[0]

        # 4. Same bits every run: shards are fixed by the batch size and the worker count, and
        #    outputs are combined in shard order.
        again = step(params, x, y)
        assert float(again[0]) == float(step(params, x, y)[0])
        step.shutdown()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
