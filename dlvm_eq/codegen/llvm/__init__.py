"""LLVM IR emission shared by the CPU and GPU targets: the emitter (emitter.py), loops
(loops.py), expression lowering (lower_expr.py), polynomial math functions (polymath.py),
kernel symbols named by the hash of their IR (symbols.py),
streaming stores (streaming.py) and the lock around LLVM's global context (llvm_lock.py).

May import: `kernels`, llvmlite. Codegen's layers, lowest first:
kernels < llvm < cpu < gpu < runtime < planning < execution.
"""
