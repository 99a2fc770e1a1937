"""The public calls on IR modules, with declared adjoints resolved first: `dq.interpret` and
`dq.optimize` behave on a module holding `[adjoint @f ...]` declarations as on one whose
bodies are written out.

    dq.interpret(dq.load("examples/logreg.dl"), "loss_grad", w, b, x, y)
    dq.optimize(module).module["loss_grad"]       # synthesized, then optimized
"""
from __future__ import annotations

from ..ir.interp import interpret as interpret_resolved
from ..ir.module import Module
from .adjoints import resolve_adjoints


def interpret(module: Module, name: str, *arrays, float64: bool = False):
    """Run function `name` of `module` on numpy arrays with the reference interpreter; an
    array or a tuple of arrays. float64: compute float tensors in float64 (the oracle)."""
    return interpret_resolved(resolve_adjoints(module, [name]), name, *arrays, float64=float64)


def optimize(module: Module, func: str | None = None, *args, **options):
    """`dlvm_eq.egraph.optimize.optimize` (same options: rules, target, budget, extractor,
    schedule, time_limit, explain, deadline) on `module` with its declared adjoints (those
    `func` reaches, or all) synthesized; an OptimizeResult."""
    from ..egraph import load_bindings   # egglog: only when an e-graph is built
    load_bindings()
    from ..egraph.optimize import optimize as optimize_resolved
    roots = None if func is None else [func]
    return optimize_resolved(resolve_adjoints(module, roots), func, *args, **options)


__all__ = ["interpret", "optimize"]
