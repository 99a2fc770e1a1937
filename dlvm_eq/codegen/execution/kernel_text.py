"""The text of a plan's kernels: LLVM IR for the host CPU (as handed to LLVM's O3 pipeline) or
PTX for an sm_* architecture (what `dlvm-eq codegen --emit llvm|ptx` prints).

    for name, text in kernel_texts(plan, "ptx", "sm_75"): ...
"""

from __future__ import annotations

from ...errors import DlvmError

EMITS = ("llvm", "ptx")


def kernel_texts(plan, emit: str, arch: str = "sm_75") -> list[tuple[str, str]]:
    """(kernel name, LLVM IR or PTX text) for every kernel of `plan`."""
    from ..cpu.llvm_cpu import cpu_ir
    from ..cpu.map_reduce_ir import map_reduce_ir
    from ..cpu.rows_ir import rows_ir
    from ..gpu.llvm_ptx import ARCHS, ptx_kernel
    from ..planning.plan import MapReduceStep, RowStep

    if emit not in EMITS:
        raise DlvmError(f"unknown kernel text {emit!r} (expected one of {', '.join(EMITS)})")
    if emit == "ptx" and arch not in ARCHS:
        raise DlvmError(f"unknown PTX target {arch!r} (expected one of {', '.join(ARCHS)})")
    out = []
    for k in plan.kernels:
        if isinstance(k, RowStep) and emit == "llvm":
            text = rows_ir(k.spec).text
        elif isinstance(k, MapReduceStep):
            if emit != "llvm":  # planned for the CPU only (planning/map_reduce.py)
                raise DlvmError(f"{k.name}: a map-reduce kernel has no PTX form; plan for gpu")
            text = map_reduce_ir(k.spec).text
        else:
            text = cpu_ir(k.spec).text if emit == "llvm" else ptx_kernel(k.spec, arch).ptx
        out.append((k.name, text))
    return out
