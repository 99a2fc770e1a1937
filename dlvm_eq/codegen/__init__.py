"""Code generation: fused elementwise and reduction kernels -> LLVM (CPU JIT) and PTX (GPU).

    >>> import numpy as np
    >>> from dlvm_eq.codegen import KernelSpec, KernelInput, Load, unary, compile_cpu
    >>> x = Load(0)
    >>> k = compile_cpu(KernelSpec("silu", (8,), [KernelInput("f32")], [unary("sigmoid", x) * x]))
    >>> float(k(np.ones(8, np.float32))[0])
    0.7310585975646973

Whole functions: `plan_flat(flat, name, fusion_decision)` plans a flattened IR function into
kernels, matmuls and views (print the plan to see what was fused) and `program(plan, target)`
runs it (`CpuProgram` / `GpuProgram`). The pipeline (dlvm_eq/pipeline: `dq.compile`, `dq.jit`)
sequences optimize, the fusion decision, plan and build; this package receives the plan and the
decision as data.

Subpackages, lowest layer first; each imports only the ones before it (its __init__ says what
it owns); none imports dsl, egraph, ad, pipeline or the root package (the import-linter
contracts in pyproject.toml):
  kernels    kernel specs as plain data (KernelSpec, ReduceSpec, RowSpec, MapReduceSpec),
             layouts, the numpy oracle, cache keys
  llvm       LLVM IR emission shared by both targets (emitter, loops, lowering, math, lock)
  cpu        the CPU target's IR builders (elementwise/reduction, row, map-reduce kernels, GEMM)
  gpu        NVPTX kernels and their CuPy launcher
  runtime    the JIT and its caches, buffers, threads and the native pool, compiled kernels,
             the GEMM's runtime
  planning   IR -> plan (the planner, row fusion, GEMM epilogues, step order, views, plan data,
             the fusion decision's record)
  execution  running a plan, argument checks, kernels as LLVM IR / PTX text

Threads: a module holding mutable module-level state (caches, pools, locks) says in its
docstring ("Shared state") what owns each object and why concurrent calls are safe; every
other module holds constants only (kernels/spec.py's Expr nodes memoize their hash: a race
computes the same value twice).
"""

from ..lazy_attributes import lazy_attributes

# name -> submodule; loaded on first access (PEP 562), so that a compile loads only what it
# needs: a warm-cache compile loads no planner, no IR builder for the GPU and no CuPy launcher.
_LAZY = {
    "BufferPool": "runtime.buffers",
    "CpuKernel": "runtime.cpu_kernel",
    "compile_cpu": "runtime.cpu_kernel",
    "stats": "runtime.jit",
    "GpuKernel": "gpu.gpu_runtime",
    "GpuUnavailable": "gpu.gpu_runtime",
    "compile_gpu": "gpu.gpu_runtime",
    "gpu_available": "gpu.gpu_runtime",
    "cupy_module": "gpu.gpu_runtime",
    **{
        n: "kernels.spec"
        for n in (
            "DLVM_NAMES",
            "BINARY_OPS",
            "REDUCE_OPS",
            "UNARY_OPS",
            "Binary",
            "Cast",
            "Const",
            "Expr",
            "KernelError",
            "Load",
            "Select",
            "Unary",
            "binary",
            "op_name",
            "unary",
        )
    },
    **{n: "kernels.kernel_spec" for n in ("KernelInput", "KernelSpec", "ReduceSpec")},
    "RowSpec": "kernels.rows",
    "MapReduceSpec": "kernels.map_reduce",
    "cache_key": "kernels.kernel_cache",
    "set_cache_dir": "kernels.kernel_cache",
    "evaluate": "kernels.reference",
    "cpu_ir": "cpu.llvm_cpu",
    "ptx_kernel": "gpu.llvm_ptx",
    "Plan": "planning.plan",
    "PlanError": "planning.plan",
    "plan_schema": "planning.plan_records",
    **{n: "planning.planner" for n in ("fusion_rows", "plan_flat", "rows_for")},
    "plan_settings": "planning.epilogue",
    "FusionReport": "planning.fusion_report",
    "CpuProgram": "execution.executor",
    "GpuProgram": "execution.executor",
    "program": "execution.executor",
    "check_argument": "execution.arguments",
    "kernel_texts": "execution.kernel_text",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())


__all__ = [
    "BINARY_OPS",
    "BufferPool",
    "Binary",
    "Cast",
    "Const",
    "CpuKernel",
    "CpuProgram",
    "DLVM_NAMES",
    "Expr",
    "FusionReport",
    "GpuKernel",
    "GpuProgram",
    "GpuUnavailable",
    "KernelError",
    "KernelInput",
    "KernelSpec",
    "MapReduceSpec",
    "Load",
    "Plan",
    "PlanError",
    "REDUCE_OPS",
    "ReduceSpec",
    "RowSpec",
    "Select",
    "UNARY_OPS",
    "Unary",
    "binary",
    "cache_key",
    "check_argument",
    "compile_cpu",
    "compile_gpu",
    "cpu_ir",
    "cupy_module",
    "evaluate",
    "fusion_rows",
    "gpu_available",
    "kernel_texts",
    "op_name",
    "plan_flat",
    "plan_schema",
    "plan_settings",
    "program",
    "ptx_kernel",
    "rows_for",
    "set_cache_dir",
    "stats",
    "unary",
]
