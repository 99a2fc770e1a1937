"""`data_parallel`: one step function, run on shards of the batch by Ray actors, combined into
the whole batch's result.

    step = dq.distributed.data_parallel(
        dq.value_and_grad(loss, argnums=(0, 1)), batch_argnums=(2, 3), workers=2)
    value, grads = step(w, b, x, y)        # == dq.value_and_grad(loss, argnums=(0, 1))(w, b, x, y)

Per call: the non-batch arguments (the parameters) go into Ray's object store once, as one
ref that every worker reads; each shard is put once too (a retried shard reuses its ref); the
driver combines the outputs in shard order (reduction.py).
"""

from __future__ import annotations

from ..cache import shared_cache
from ..dsl.context import user_location
from ..errors import DlvmError
from .faults import gather, log
from .ray_runtime import require_ray
from .reduction import combine
from .sharding import REDUCTIONS, batch_rows, shard_plan
from .worker import ShardWorker, worker_options


class DataParallel:
    """A step function split across `workers` Ray actors along axis 0 of its batch arguments.

    `reduction` says what the step's outputs are over the batch: "mean" (the default: a loss
    that is the mean over axis 0, and its gradients) weights shard k by rows_k / rows, so that
    unequal shards give the whole batch's mean; "sum" (a loss summed over examples) adds the
    shards. A loss that is neither (normalised by something other than the row count, or
    coupling rows, like batch statistics) is not a sum of per-shard terms: data_parallel would
    not equal the single-process step, so do not use it for one.
    """

    def __init__(
        self,
        fn,
        batch_argnums,
        workers: int = 2,
        reduction: str = "mean",
        max_retries: int = 3,
        max_restarts: int = 10,
        timeout_s: float | None = None,
    ):
        positions = (batch_argnums,) if isinstance(batch_argnums, int) else tuple(batch_argnums)
        if (
            not positions
            or not all(isinstance(p, int) and p >= 0 for p in positions)
            or len(set(positions)) != len(positions)
        ):
            raise DlvmError(
                f"data_parallel: batch_argnums must be distinct non-negative argument "
                f"positions, got {batch_argnums!r}"
            )
        if not isinstance(workers, int) or workers < 1:
            raise DlvmError(f"data_parallel: workers must be a positive int, got {workers!r}")
        if reduction not in REDUCTIONS:
            raise DlvmError(
                f"data_parallel: reduction must be one of {REDUCTIONS}, got {reduction!r}"
            )
        self.fn, self.batch_argnums, self.workers = fn, tuple(sorted(positions)), workers
        self.reduction, self.max_retries, self.timeout_s = reduction, max_retries, timeout_s
        self.steps = 0
        self._ray = ray = require_ray()
        if not ray.is_initialized():  # where Ray runs is the user's choice: ray.init(address=...)
            ray.init(include_dashboard=False)
        cpus = ray.cluster_resources().get("CPU", 0)
        if cpus < workers:  # one CPU each: the rest wait for a node to join (an autoscaler)
            log.warning(
                "data_parallel: %d workers need %d CPUs, the Ray cluster has %g; the "
                "steps wait for more",
                workers,
                workers,
                cpus,
            )
        actor = ray.remote(ShardWorker).options(
            **worker_options(str(shared_cache().root), max_restarts)
        )
        # pickled once for all workers; held here, since a restart reads it again (Ray frees an
        # object nobody refers to, and a finished constructor no longer does)
        self._fn_ref = ray.put(fn)
        self._actors = [actor.remote(self._fn_ref) for _ in range(workers)]

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise DlvmError("data_parallel: pass the step's arguments by position")
        if self._actors is None:
            raise DlvmError("data_parallel: this step was shut down")
        if self.batch_argnums[-1] >= len(args):
            raise DlvmError(
                f"data_parallel: batch_argnums {self.batch_argnums} name argument "
                f"{self.batch_argnums[-1]}, but the step got {len(args)} arguments"
            )
        ray = self._ray
        plan = shard_plan(batch_rows(args, self.batch_argnums), self.workers)
        shared = ray.put(tuple(a for i, a in enumerate(args) if i not in self.batch_argnums))
        shards = [ray.put(s) for s in plan.slices([args[i] for i in self.batch_argnums])]
        self.steps += 1
        location = user_location()  # the user's line here: a worker's error names it
        outputs = gather(
            self._actors,
            lambda i: self._actors[i].run.remote(shared, self.batch_argnums, shards[i], location),
            len(shards),
            self.max_retries,
            self.timeout_s,
            self.steps,
        )
        return combine(outputs, plan.weights(self.reduction))

    def worker_pids(self) -> list[int]:
        """The process id of each worker (a restarted worker has a new one)."""
        return self._ray.get([a.pid.remote() for a in self._actors], timeout=self.timeout_s)

    def shutdown(self) -> None:
        """Stop the workers (Ray itself keeps running: it is the user's)."""
        for a in self._actors or ():
            self._ray.kill(a, no_restart=True)
        self._actors = self._fn_ref = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


def data_parallel(fn, batch_argnums, workers: int = 2, reduction: str = "mean", **options):
    """`fn` (a `dq.value_and_grad(...)`, `dq.grad(...)` or any dq function returning float arrays)
    run data-parallel on `workers` Ray actors; see DataParallel for the options."""
    return DataParallel(fn, batch_argnums, workers, reduction, **options)
