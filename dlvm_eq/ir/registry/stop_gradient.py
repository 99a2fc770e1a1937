"""`stopGradient`: the identity whose operand gets no adjoint (`dq.stop_gradient`, as
`jax.lax.stop_gradient`). An op of its own, not an identity the e-graph may erase: extracted
adjoint programs keep it, so a second derivative through it is zero too.

    %y = stopGradient %x: <3 x f32>           // y = x; d y / d x treated as 0
"""

from __future__ import annotations

from ..op_spec import UNARY, OpSpec, elementwise_type
from .batch_rules import elementwise


def spec() -> OpSpec:
    return OpSpec(
        "stopGradient",
        UNARY,
        1,
        "StopGradient",
        lambda ts, at: elementwise_type("stopGradient", ts),
        lambda args, at: args[0].copy(),
        differentiable=False,  # the reverse pass sends it no adjoint: no rule in adjoint.egg
        dsl=("stop_gradient",),
        kernel="stopGradient",
        scalar=lambda k, x: x,
        # its value; verify_gradient differentiates sympy expressions and would see through it
        sympy=lambda sp, x: x,
        cost="cheap",
        batch=elementwise,
    )
