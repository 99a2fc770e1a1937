"""A training loop around a (data-parallel) step: the optimizer runs on the driver.

    step = data_parallel(dq.value_and_grad(loss, argnums=0), batch_argnums=(1, 2), workers=2)
    params, losses = train(step, params, [(x0, y0), (x1, y1)], dq.optim.adam(1e-3))

The driver holds the only copy of the parameters and the optimizer state; each step broadcasts
the parameters to every worker (one object-store ref), so the replicas cannot drift apart and a
restarted worker needs no state: it is given the current parameters with its next shard. The
same loop with the undistributed step (`train(dq.value_and_grad(loss), ...)`) is the
single-process reference.
"""

from __future__ import annotations

from ..dsl import optim


def train(step, params, batches, optimizer=None, on_step=None):
    """Runs `value, grads = step(params, *batch)` and the optimizer's update for each batch (a
    tuple of the step's batch arguments). `optimizer` is a `dq.optim` optimizer (default
    `dq.optim.sgd(0.1)`); `on_step(i, value)` is called after each step. Returns (final params,
    the loss of each step as a float)."""
    optimizer = optimizer or optim.sgd(0.1)
    state = optimizer.init(params)
    losses = []
    for i, batch in enumerate(batches):
        value, grads = step(params, *batch)
        params, state = optimizer.update(grads, state, params)
        losses.append(float(value))
        if on_step is not None:
            on_step(i, value)
    return params, losses
