"""`check_grads` with `dq.grad` as its default transformation: the numeric oracle
(dlvm_eq/verify/numeric.py, central differences) pointed at the pipeline's own gradients.

    check_grads(loss, (w, x), order=2)      # raises GradientCheckError on a disagreement
"""

from __future__ import annotations

from ..verify import numeric
from .differentiate import grad as dq_grad


def check_grads(f, args, order: int = 1, *, grad=None, **options):
    """`dlvm_eq.verify.check_grads(f, args, order, grad=grad or dq.grad, ...)`."""
    return numeric.check_grads(f, args, order, grad=grad or dq_grad, **options)


__all__ = ["check_grads"]
