"""The GPU target: NVPTX kernels (llvm_ptx.py; also their host emulation, built for the CPU's
target machine) and their CuPy launcher (gpu_runtime.py).

May import: `kernels`, `llvm`, `cpu` (the host target machine for emulation), llvmlite, CuPy
(lazily). Codegen's layers, lowest first:
kernels < llvm < cpu < gpu < runtime < planning < execution.
"""
