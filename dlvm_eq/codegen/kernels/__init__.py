"""Kernel specs as plain data: `KernelSpec` / `ReduceSpec` and their expression DAG (spec.py),
`RowSpec` (rows.py), loop layouts (layout.py), the numpy oracle of a spec (reference.py), a
spec's text for cache keys (spec_text.py) and the kernel cache's key and disk store
(kernel_cache.py).

May import: `dlvm_eq.ir` (types), `dlvm_eq.cache`, `dlvm_eq.errors`; nothing else of codegen.
Codegen's layers, lowest first: kernels < llvm < cpu < gpu < runtime < planning < execution.
"""
