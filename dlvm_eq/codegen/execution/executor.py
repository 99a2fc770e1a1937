"""Run a kernel plan: `CpuProgram` on numpy arrays (cpu_program.py), `GpuProgram` on CuPy
arrays (gpu_program.py); `program(plan, target)` picks one.

    prog = program(plan, "cpu")
    out = prog(x, w)          # numpy arrays in, numpy arrays out (a tuple for tuple results)

Everything that does not depend on the arguments is done once, when the program is built:
kernels compiled, steps turned into small closures on a slot list (step_runs.py), temporaries
placed. The CPU keeps temporaries in a reused arena and hands outputs to the caller
(output_buffers.py); the GPU allocates every temporary and output per call from CuPy's pool.
"""

from __future__ import annotations

from ...errors import DlvmError
from ..planning.plan import Plan
from .cpu_program import CpuProgram
from .gpu_program import GpuProgram


def program(plan: Plan, target: str = "cpu", cast: bool = False):
    """The plan compiled for `target`; arguments of another dtype than declared are an error,
    or cast with `cast=True` (arguments.py)."""
    if target not in ("cpu", "gpu"):
        raise DlvmError(f"unknown code generation target {target!r} (expected cpu or gpu)")
    prog = CpuProgram(plan) if target == "cpu" else GpuProgram(plan)
    prog.cast = cast
    return prog


__all__ = ["CpuProgram", "GpuProgram", "program"]
