"""Running a plan: `CpuProgram` / `GpuProgram` (executor.py) and the checks of a call's
arguments (arguments.py).

May import every other codegen subpackage. Codegen's layers, lowest first:
kernels < llvm < cpu < gpu < runtime < planning < execution.
"""
