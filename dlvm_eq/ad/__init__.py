"""Reverse-mode differentiation as adjoint code generation in the e-graph (rules/adjoint.egg).

    from dlvm_eq.ad import adjoint_function
    df = adjoint_function(module, module["f"], wrt=(0,))     # an IR Function

`synthesize_declared(module, fn)` fills in a bodiless `[adjoint @f ...]` declaration; the
Python API (`grad`, `value_and_grad`, `vjp`) lives in dlvm_eq.ad.api.

Owns the reverse pass over a loaded program's Lets (driver.py) and flop counts (flops.py). May
import egraph, extract, ir and the base modules; egraph never imports it.
"""
from .driver import (AdjointConfig, AdjointError, adjoint_function, adjoint_signature, configure,
                     synthesize_declared)

__all__ = ["AdjointConfig", "AdjointError", "adjoint_function", "adjoint_signature", "configure",
           "synthesize_declared"]
