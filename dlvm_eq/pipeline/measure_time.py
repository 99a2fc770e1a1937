"""A compiled function's measured time next to its predicted one: `--measure`.

    measured = measure_compiled(f, repeats=20)    # random inputs of the declared types
    print(f.report)                               # predicted and measured time per call
    print(f.report.predicted.table(measured.steps))   # per step, on the CPU

The median call over `repeats` calls after a warm-up; on the CPU also each step's median (one
more pass of calls with every step timed, `CpuProgram.timed_call`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..errors import DlvmError
from ..ir.sample import sample_array
from ..ir.types import DType, TensorType


@dataclass(frozen=True)
class Measured:
    median: float  # seconds per call
    calls: int
    steps: list | None = None  # each plan step's median seconds (CPU), else None


def measure_compiled(compiled, args=None, repeats: int = 20, seed: int = 0) -> Measured:
    """Time `compiled` (a pipeline Compiled) on `args`, or on random inputs of its parameters'
    types; the result is stored on its report, which then prints it next to the prediction."""
    if repeats < 1:
        raise DlvmError(f"--repeats must be at least 1, got {repeats}")
    program = compiled.program
    if args is None:
        args = _random_arguments(compiled, seed)
    compiled(*args)  # warm-up: first-use builds (epilogues) and page faults
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        compiled(*args)
        times.append(time.perf_counter() - t0)
    steps = None
    timed = getattr(program, "timed_call", None)
    if timed is not None:
        runs = [timed(*args)[1] for _ in range(repeats)]
        steps = (
            [statistics.median(r[i] for r in runs) for i in range(len(runs[0]))] if runs[0] else []
        )
    measured = Measured(statistics.median(times), repeats, steps)
    compiled.report.measured = measured
    return measured


def _random_arguments(compiled, seed: int) -> list[np.ndarray]:
    """Standard-normal floats (small ints, random bools) of the plan's parameter types."""
    rng = np.random.default_rng(seed)
    slots = [compiled.plan.slots[s] for s in compiled.plan.params]
    return [sample_array(TensorType(s.shape, DType(s.dtype)), rng) for s in slots]


__all__ = ["Measured", "measure_compiled"]
