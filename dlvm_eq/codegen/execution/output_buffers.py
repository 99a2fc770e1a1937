"""Output buffers of a CPU program's results (cpu_program.py): each call takes a buffer that
the caller no longer references (checked with its reference count, views included) or
allocates one, so results of one call are never overwritten by the next, and a loop that drops
its results reuses the same memory.

    outs = OutputBuffers((3,), np.dtype("float32"))
    outs.take(env, slot)      # env[slot] = a buffer nobody else holds
    copies, same = returned_twice(plan)   # a value returned twice: one buffer, no copy step
"""

from __future__ import annotations

import sys
import threading

import numpy as np

from ..kernels.kernel_spec import c_strides
from ..planning.plan import OUTPUT, CopyStep, Plan
from ..runtime.buffers import aligned_empty

KEEP_OUTPUTS = 4  # output buffers remembered per result for reuse


def _owner(a: np.ndarray) -> np.ndarray:
    return a if a.base is None else a.base


def _refcounts(entry) -> tuple[int, int]:
    buf, owner = entry
    return sys.getrefcount(buf), sys.getrefcount(owner)


def _calibrate() -> tuple[int, int]:
    """Reference counts of an output buffer nobody outside the program holds, measured on the
    same code path (`_refcounts`) that checks real buffers."""
    buf = aligned_empty((4,), np.float32)
    entries = [(buf, _owner(buf))]
    del buf
    return _refcounts(entries[0])


_FREE = _calibrate()


class OutputBuffers:
    """Buffers for one result: reuse one the caller has dropped, else allocate. The lock makes
    "check the reference count, hand it out" one step: two threads calling the same program
    must never both see a dropped buffer as free and both write into it."""

    __slots__ = ("shape", "dtype", "entries", "lock")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype
        self.entries: list = []
        self.lock = threading.Lock()

    def take(self, env: list, slot: int) -> None:
        """env[slot] = a free buffer (stored under the lock: from then on it is referenced)."""
        with self.lock:
            for entry in self.entries:
                if _refcounts(entry) == _FREE:
                    env[slot] = entry[0]
                    return
            buf = aligned_empty(self.shape, self.dtype)
            self.entries.append((buf, _owner(buf)))
            if len(self.entries) > KEEP_OUTPUTS:
                del self.entries[0]
            env[slot] = buf


def returned_twice(plan: Plan) -> tuple[set[int], dict[int, int]]:
    """(indexes of the plan's copies of one whole output into another, output slot -> the
    output it copies): the planner gives every result a buffer of its own, so a value returned
    twice is copied; the CPU program skips the copy and returns the one buffer twice, as Python
    returns `y, y` (a result is never an argument or a temporary: those copies stay)."""
    copies: set[int] = set()
    same: dict[int, int] = {}
    slots = plan.slots
    for i, step in enumerate(plan.steps):
        if not isinstance(step, CopyStep) or step.src.chain:
            continue
        src, out = slots[step.src.slot], slots[step.out]
        if (
            src.role == OUTPUT
            and out.role == OUTPUT
            and src.dtype == out.dtype
            and tuple(step.src.shape) == tuple(src.shape) == tuple(out.shape)
            and tuple(step.src.strides) == c_strides(tuple(src.shape))
        ):
            copies.add(i)
            same[step.out] = same.get(step.src.slot, step.src.slot)
    return copies, same


__all__ = ["KEEP_OUTPUTS", "OutputBuffers", "returned_twice"]
