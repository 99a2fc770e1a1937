"""How a batch is split across workers, and how much each shard weighs in the combined result.

    plan = shard_plan(rows=10, workers=3)     # ShardPlan(bounds=((0, 4), (4, 7), (7, 10)), ...)
    plan.weights("mean")                      # (0.4, 0.3, 0.3): shard mean -> whole-batch mean
    plan.weights("sum")                       # (1.0, 1.0, 1.0): shard sums add up

Shards are contiguous row ranges along axis 0 whose sizes differ by at most one (numpy's
array_split), fixed by the batch size and the worker count alone, so a rerun splits the same
way. With fewer rows than workers the extra workers get no shard (an empty shard has no mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DlvmError

REDUCTIONS = ("mean", "sum")


@dataclass(frozen=True)
class ShardPlan:
    rows: int
    bounds: tuple[tuple[int, int], ...]

    def weights(self, reduction: str) -> tuple[float, ...]:
        if reduction == "mean":
            return tuple((stop - start) / self.rows for start, stop in self.bounds)
        return (1.0,) * len(self.bounds)

    def slices(self, arrays) -> list[tuple]:
        """Per shard, the row slice of every batch array (views: Ray copies them once)."""
        return [tuple(a[start:stop] for a in arrays) for start, stop in self.bounds]


def shard_plan(rows: int, workers: int) -> ShardPlan:
    if rows < 1:
        raise DlvmError("data_parallel: the batch is empty (axis 0 has length 0)")
    n = min(workers, rows)
    # array_split's sizes: the first rows % n shards get one row more
    sizes = [rows // n + (i < rows % n) for i in range(n)]
    starts = np.cumsum([0] + sizes)
    return ShardPlan(rows, tuple((int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])))


def batch_rows(args, batch_argnums) -> int:
    """The common length of the batch arguments along axis 0, or a DlvmError naming the one
    that differs."""
    rows = None
    for i in batch_argnums:
        shape = np.shape(args[i])
        if len(shape) == 0:
            raise DlvmError(
                f"data_parallel: batch argument {i} is a scalar; batch arguments are "
                f"split along axis 0"
            )
        if rows is None:
            rows, first = shape[0], i
        elif shape[0] != rows:
            raise DlvmError(
                f"data_parallel: batch arguments disagree along axis 0: argument "
                f"{first} has {rows} rows, argument {i} has {shape[0]}"
            )
    return rows
