"""Code generation: fused elementwise and reduction kernels -> LLVM (CPU JIT) and PTX (GPU).

    >>> import numpy as np
    >>> from dlvm_eq.codegen import KernelSpec, KernelInput, Load, unary, compile_cpu
    >>> x = Load(0)
    >>> k = compile_cpu(KernelSpec("silu", (8,), [KernelInput("f32")], [unary("sigmoid", x) * x]))
    >>> float(k(np.ones(8, np.float32))[0])
    0.7310585975646973

Files: kernel (the spec), layout (loop layouts), emitter/polymath/lower_expr/loops (IR
building), llvm_cpu / llvm_ptx (targets), cpu_runtime / gpu_runtime (running), kernel_cache
(disk), reference (numpy oracle).
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

__all__ = [
    "BINARY_OPS", "BufferPool", "Binary", "Cast", "Const", "CpuKernel", "DLVM_NAMES", "Expr",
    "GpuKernel", "GpuUnavailable", "KernelError", "KernelInput", "KernelSpec", "Load",
    "REDUCE_OPS", "ReduceSpec", "Select", "UNARY_OPS", "Unary", "binary", "compile_cpu",
    "compile_gpu", "cpu_ir", "evaluate", "gpu_available", "op_name", "ptx_kernel",
    "set_cache_dir", "stats", "unary",
]
