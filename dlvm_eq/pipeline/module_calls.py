"""The public calls on IR modules, with declared adjoints resolved first: `dq.interpret`,
`dq.optimize` and `verify_adjoint` behave on a module holding `[adjoint @f ...]` declarations
as on one whose bodies are written out.

    dq.interpret(dq.load("examples/logreg.dl"), "loss_grad", w, b, x, y)
    dq.optimize(module).module["loss_grad"]       # synthesized, then optimized
    verify_adjoint(m["loss"], m["loss_grad"], module=m, wrt=(0, 1))   # sympy: exact
"""

from __future__ import annotations

from ..ir.interp import interpret as interpret_resolved
from ..ir.module import Module
from .adjoints import resolve_adjoints


def interpret(module: Module, name: str, *arrays, float64: bool = False):
    """Run function `name` of `module` on numpy arrays with the reference interpreter; an
    array or a tuple of arrays. float64: compute float tensors in float64 (the oracle)."""
    return interpret_resolved(resolve_adjoints(module, [name]), name, *arrays, float64=float64)


def optimize(
    module: Module,
    func: str | None = None,
    *args,
    verify_rules: bool = False,
    never_slower: bool = True,
    **options,
):
    """`dlvm_eq.egraph.optimize.optimize` (same options: rules, target, budget, extractor,
    schedule, time_limit, explain, deadline) on `module` with its declared adjoints (those
    `func` reaches, or all) synthesized; an OptimizeResult. verify_rules=True refuses a rule
    of `rules` that verify-rules cannot prove (VerificationError, file:line), as on dq.jit.
    never_slower: each program the e-graph would replace (a function, or a straight piece or
    body of one with loops) is replaced only where the never-slower guard keeps it, as on
    dq.jit (never_slower.py); the report says which was kept and why."""
    if verify_rules:
        from .verified_rules import check_user_rules

        check_user_rules((args[0] if args else options.get("rules")) or (), "optimize")
    from ..egraph import load_bindings  # egglog: only when an e-graph is built

    load_bindings()
    from ..egraph.optimize import optimize as optimize_resolved

    if never_slower and "guard" not in options:
        from .never_slower import guard_for

        target = args[1] if len(args) > 1 else options.get("target", "cpu")
        options["guard"] = guard_for(target)
    roots = None if func is None else [func]
    resolved = resolve_adjoints(module, roots)
    # a function with loops: its pieces and bodies share one e-graph (egraph/optimize_loops.py)
    return optimize_resolved(resolved, func, *args, **options)


def verify_adjoint(forward, adjoint, *args, module: Module | None = None, **options):
    """`dlvm_eq.verify.verify_adjoint` (same arguments) with `forward`, `adjoint` and what
    they apply resolved in `module` first, so that `adjoint` may be a declaration."""
    from ..verify import verify_adjoint as verify_resolved  # sympy: only for this call

    if module is not None:
        fns = module.functions
        names = [f.name for f in (forward, adjoint) if f.name in fns and fns[f.name] is f]
        resolved = resolve_adjoints(module, names)
        forward, adjoint = (resolved[f.name] if f.name in names else f for f in (forward, adjoint))
        module = resolved
    options["module"] = module  # by keyword, as verify_resolved takes it
    return verify_resolved(forward, adjoint, *args, **options)


__all__ = ["interpret", "optimize", "verify_adjoint"]
