"""Code generation: fused elementwise and reduction kernels -> LLVM (CPU JIT) and PTX (GPU).

    >>> import numpy as np
    >>> from dlvm_eq.codegen import KernelSpec, KernelInput, Load, unary, compile_cpu
    >>> x = Load(0)
    >>> k = compile_cpu(KernelSpec("silu", (8,), [KernelInput("f32")], [unary("sigmoid", x) * x]))
    >>> float(k(np.ones(8, np.float32))[0])
    0.7310585975646973

Whole functions: `compile(module, name, target="cpu"|"gpu")` plans an IR function into
kernels, BLAS calls and views (`plan_function`; print the plan to see what was fused) and runs
it (`CpuProgram` / `GpuProgram`). Importing this package registers the "cpu" and "gpu" targets
of `dq.jit`.

Files: kernel (the spec), layout (loop layouts), emitter/polymath/lower_expr/loops (IR
building), llvm_cpu / llvm_ptx (targets), cpu_runtime / gpu_runtime (running), kernel_cache
(disk), reference (numpy oracle); views (strides of layout ops), plan (the plan's data),
fusion (IR -> plan), executor (running a plan), backend (compile, reports, DSL targets).
"""
from .cpu_runtime import BufferPool, CpuKernel, compile_cpu, stats
from .gpu_runtime import GpuKernel, GpuUnavailable, compile_gpu, gpu_available
from .kernel import (DLVM_NAMES, BINARY_OPS, REDUCE_OPS, UNARY_OPS, Binary, Cast, Const, Expr,
                     KernelError, KernelInput, KernelSpec, Load, ReduceSpec, Select, Unary, binary,
                     op_name, unary)
from .kernel_cache import set_cache_dir
from .llvm_cpu import cpu_ir
from .llvm_ptx import ptx_kernel
from .reference import evaluate
from .plan import Plan
from .fusion import plan_function
from .plan import PlanError
from .executor import CpuProgram, GpuProgram
from .backend import CompileReport, Compiled, compile, compile_seconds, register as _register

__all__ = [
    "BINARY_OPS", "BufferPool", "Binary", "Cast", "CompileReport", "Compiled", "Const",
    "CpuKernel", "CpuProgram", "DLVM_NAMES", "Expr", "GpuKernel", "GpuProgram", "GpuUnavailable",
    "KernelError", "KernelInput", "KernelSpec", "Load", "Plan", "PlanError", "REDUCE_OPS",
    "ReduceSpec", "Select", "UNARY_OPS", "Unary", "binary", "compile", "compile_cpu",
    "compile_gpu", "compile_seconds", "cpu_ir", "evaluate", "gpu_available", "op_name",
    "plan_function", "ptx_kernel", "set_cache_dir", "stats", "unary",
]

_register()   # dq.jit(target="cpu"|"gpu")
