"""The Ray actor that runs one shard of a data-parallel step.

Each worker holds the user's step function (a `dq.value_and_grad(...)` or any dq function of
arrays); pickling a `dq.jit` carries its Python function only, so the worker compiles the same
program on its first call, through the shared disk cache where the driver's cache directory is
reachable (it is passed in the actor's environment, with one compute thread per worker).

    actor = ShardWorker.options(**worker_options(cache_dir, restarts)).remote(fn)
    out = actor.run.remote(shared_ref, batch_positions, shard)   # fn's output, a pytree
"""

from __future__ import annotations

import os

from ..dsl.context import called_from
from ..errors import DlvmError
from .faults import RaisedInWorker


class ShardWorker:
    """One replica: `run` calls the step on the broadcast arguments plus this worker's shard."""

    def __init__(self, fn):
        self.fn = fn

    def run(self, shared, batch_positions, shard, location=None):
        """`shared` is the tuple of non-batch arguments (resolved from its object-store ref by
        Ray), `shard` this worker's slices of the batch arguments, in `batch_positions` order;
        `location` the user's (file, line, col) on the driver, for errors no frame of the
        step's own locates."""
        args = list(shared)
        for position, value in zip(batch_positions, shard):
            args.insert(position, value)
        try:
            return called_from(location, self.fn, *args)
        except DlvmError as e:  # a user error travels as itself, not as a RayTaskError
            return RaisedInWorker.capture(e)

    def pid(self) -> int:
        return os.getpid()


def worker_options(cache_dir: str, max_restarts: int) -> dict:
    """Ray actor options: one CPU and one compute thread each, the driver's compile cache,
    restarted by Ray when its process dies (the driver retries the lost shard itself)."""
    return {
        "num_cpus": 1,
        "max_restarts": max_restarts,
        "max_task_retries": 0,
        "runtime_env": {"env_vars": {"DLVM_EQ_NUM_THREADS": "1", "DLVM_EQ_CACHE_DIR": cache_dir}},
    }
