"""Running kernels on the CPU: the kernel loader and its caches (jit.py, object_check.py;
object_loader.py loads object code without LLVM, MCJIT where it cannot), buffers (buffers.py), threads (threads.py, native_pool.py, cpu_count.py), compiled kernels
(cpu_kernel.py, row_kernel.py) and our GEMM's runtime (gemm_runtime.py).

May import: `kernels`, `llvm`, `cpu` (IR builders, lazily: on a cache miss only), `gpu` (not
used today), llvmlite, numpy. Codegen's layers, lowest first:
kernels < llvm < cpu < gpu < runtime < planning < execution.
"""
