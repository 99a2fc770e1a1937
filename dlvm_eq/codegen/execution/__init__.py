"""Running a plan: `program` (executor.py) picks `CpuProgram` (cpu_program.py) or `GpuProgram`
(gpu_program.py); their steps as closures (step_runs.py), output buffers (output_buffers.py)
and the checks of a call's arguments (arguments.py).

May import every other codegen subpackage. Codegen's layers, lowest first:
kernels < llvm < cpu < gpu < runtime < planning < execution.
"""
