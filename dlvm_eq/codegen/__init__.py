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
decision as data. May import: ir, cache, json_records, errors (never dsl, egraph, ad).

Files: kernel (the spec), layout (loop layouts), emitter/polymath/lower_expr/loops (IR
building), llvm_cpu / llvm_ptx (targets), cpu_runtime / gpu_runtime (running), native_pool
(worker threads outside the GIL), gemm / gemm_runtime (our float32 GEMM and its epilogues),
kernel_cache (disk), reference (numpy oracle); views (strides of layout ops), plan (the plan's
data), fusion (IR -> plan), epilogue (matmul + consumer -> one step), executor (running a
plan), fusion_report (the fusion decision's record in a plan), kernel_text (kernels as
LLVM IR / PTX text), llvm_lock (the lock around LLVM's context).

Threads: a module holding mutable module-level state (caches, pools, locks) says in its
docstring ("Shared state") what owns each object and why concurrent calls are safe; every
other module holds constants only (kernel.py's Expr nodes memoize their hash: a race
computes the same value twice).
"""
import importlib

# name -> submodule; loaded on first access (PEP 562), so that a compile loads only what it
# needs: a warm-cache compile loads no planner, no IR builder for the GPU and no CuPy launcher.
_LAZY = {
    "BufferPool": "cpu_runtime", "CpuKernel": "cpu_runtime", "compile_cpu": "cpu_runtime",
    "stats": "cpu_runtime",
    "GpuKernel": "gpu_runtime", "GpuUnavailable": "gpu_runtime", "compile_gpu": "gpu_runtime",
    "gpu_available": "gpu_runtime",
    **{n: "kernel" for n in ("DLVM_NAMES", "BINARY_OPS", "REDUCE_OPS", "UNARY_OPS", "Binary", "Cast",
                             "Const", "Expr", "KernelError", "KernelInput", "KernelSpec", "Load",
                             "ReduceSpec", "Select", "Unary", "binary", "op_name", "unary")},
    "set_cache_dir": "kernel_cache", "cpu_ir": "llvm_cpu", "ptx_kernel": "llvm_ptx",
    "evaluate": "reference", "Plan": "plan", "PlanError": "plan",
    **{n: "fusion" for n in ("fusion_rows", "plan_flat", "rows_for")},
    "CpuProgram": "executor", "GpuProgram": "executor", "program": "executor",
    "cache_key": "kernel_cache", "plan_schema": "plan_records", "plan_settings": "gemm_runtime",
    "FusionReport": "fusion_report", "cupy_module": "gpu_runtime", "check_argument": "arguments",
    "kernel_texts": "kernel_text",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BINARY_OPS", "BufferPool", "Binary", "Cast", "Const", "CpuKernel", "CpuProgram", "DLVM_NAMES",
    "Expr", "FusionReport", "GpuKernel", "GpuProgram", "GpuUnavailable", "KernelError", "KernelInput", "KernelSpec", "Load", "Plan", "PlanError", "REDUCE_OPS",
    "ReduceSpec", "Select", "UNARY_OPS", "Unary", "binary", "cache_key", "check_argument", "compile_cpu",
    "compile_gpu", "cpu_ir", "cupy_module", "evaluate", "fusion_rows", "gpu_available", "kernel_texts", "op_name",
    "plan_flat", "plan_schema", "plan_settings", "program", "ptx_kernel", "rows_for", "set_cache_dir", "stats", "unary",
]
