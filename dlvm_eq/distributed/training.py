"""A training loop around a (data-parallel) step: the optimizer runs on the driver.

    step = data_parallel(dq.value_and_grad(loss, argnums=0), batch_argnums=(1, 2), workers=2)
    params, losses = train(step, params, [(x0, y0), (x1, y1)], update=sgd(0.1))

The driver holds the only copy of the parameters; each step broadcasts it to every worker (one
object-store ref), so the replicas cannot drift apart and a restarted worker needs no state:
it is given the current parameters with its next shard. The same loop with the undistributed
step (`train(dq.value_and_grad(loss), ...)`) is the single-process reference.
"""
from __future__ import annotations

import numpy as np

from ..dsl import tree_map


def sgd(lr: float):
    """Plain SGD, `p - lr * g` leaf by leaf in the parameter's dtype."""
    def update(params, grads):
        return tree_map(lambda p, g: (p - lr * np.asarray(g)).astype(np.asarray(p).dtype),
                        params, grads)
    return update


def train(step, params, batches, update=None, on_step=None):
    """Runs `value, grads = step(params, *batch)` and `params = update(params, grads)` for each
    batch (a tuple of the step's batch arguments). `update` defaults to sgd(0.1); `on_step(i,
    value)` is called after each step. Returns (final params, the loss of each step)."""
    update = update or sgd(0.1)
    losses = []
    for i, batch in enumerate(batches):
        value, grads = step(params, *batch)
        params = update(params, grads)
        losses.append(float(value))
        if on_step is not None:
            on_step(i, value)
    return params, losses
