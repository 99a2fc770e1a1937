"""The CPU target's IR builders: elementwise and reduction kernels (llvm_cpu.py, also the host's
target machine and object code), row kernels (rows_ir.py) and our float32 GEMM (gemm_ir.py).
Loaded only on a kernel-cache miss: a kernel found on disk runs without them.

May import: `kernels`, `llvm`, llvmlite. Codegen's layers, lowest first:
kernels < llvm < cpu < gpu < runtime < planning < execution.
"""
