"""Symbolic oracles: sympy semantics of the IR, rule-file verification, gradient checks.

    from dlvm_eq.verify import verify_rules, verify_adjoint, verify_gradient, check_vjp, check_grads
    verify_rules("rules/algebra.egg").ok
    verify_gradient(lambda x: dq.sum(dq.exp(x) * x), [(3,)])
    check_grads(f, (x,), order=2, grad=dq.grad)     # dlvm_eq.pipeline.check_grads defaults grad

Files: symbolic (one sympy implementation per IR op), identity (is an expression zero),
sexpr/pattern (rule files as obligations), search (small shape assignments), terms (typing and
evaluating e-graph terms), rules (verify_rules), adjoint (verify_adjoint, verify_gradient),
numeric (float64 finite-difference checks).

May import: ad, egraph, extract, dsl, ir, errors (never the pipeline: check_grads takes the
gradient transformation as an argument).
"""

from ..errors import DlvmError


class VerificationError(DlvmError):
    """A rule, adjoint or gradient that is not what it claims to be."""


from .adjoint import AdjointReport, verify_adjoint, verify_gradient  # noqa: E402
from .numeric import GradientCheckError, check_grads, check_vjp  # noqa: E402
from .rules import RulesReport, Settings, verify_rules  # noqa: E402
from .symbolic import SYMBOLIC, apply_op, evaluate_function, symbol_array  # noqa: E402

__all__ = [
    "SYMBOLIC",
    "AdjointReport",
    "GradientCheckError",
    "RulesReport",
    "Settings",
    "VerificationError",
    "apply_op",
    "check_grads",
    "check_vjp",
    "evaluate_function",
    "symbol_array",
    "verify_adjoint",
    "verify_gradient",
    "verify_rules",
]
