"""Reverse-mode differentiation as adjoint code generation in the e-graph (rules/adjoint.egg).

    from dlvm_eq.ad import adjoint_function
    df = adjoint_function(module, module["f"], wrt=(0,))     # an IR Function

`synthesize_declared(module, fn)` fills in a bodiless `[adjoint @f ...]` declaration and
`resolve_declared(module, roots)` every one a module's functions reach (the pipeline calls it
once, before any stage). The Python API (`grad`, `value_and_grad`, `vjp`: trace + differentiate +
jit) lives with the pipeline (dlvm_eq/pipeline/differentiate.py).

Owns the reverse pass over a loaded program's Lets (driver.py) and flop counts (flops.py).
May import: egraph, extract, ir, cache, errors (never dsl, codegen, verify, pipeline); egraph
never imports it.
"""

from .driver import (
    AdjointConfig,
    AdjointError,
    adjoint_function,
    adjoint_signature,
    configure,
    synthesize_declared,
)
from .resolve import resolve_declared

__all__ = [
    "AdjointConfig",
    "AdjointError",
    "adjoint_function",
    "adjoint_signature",
    "configure",
    "resolve_declared",
    "synthesize_declared",
]
