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

from typing import TYPE_CHECKING

from ...errors import DlvmError
from ..planning.plan import Plan
from .cpu_program import CpuProgram

if TYPE_CHECKING:
    from .gpu_program import GpuProgram


def program(plan: Plan, target: str = "cpu", cast: bool = False):
    """The plan compiled for `target`; arguments of another dtype than declared are an error,
    or cast with `cast=True` (arguments.py)."""
    if target not in ("cpu", "gpu"):
        raise DlvmError(f"unknown code generation target {target!r} (expected cpu or gpu)")
    if target == "cpu":
        prog = CpuProgram(plan)
    else:  # the GPU program (CuPy's launcher) loads with a first GPU target
        from .gpu_program import GpuProgram

        prog = GpuProgram(plan)
    prog.cast = cast
    return prog


def __getattr__(name):
    if name == "GpuProgram":
        from .gpu_program import GpuProgram

        return GpuProgram
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CpuProgram", "GpuProgram", "program"]
