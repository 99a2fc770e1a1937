"""Special functions as DSL ops: `erf` (IR `erf`, elementwise; exact GELU is
x/2 (1 + erf(x / sqrt 2))). Its derivative 2/sqrt(pi) exp(-x^2) is an adjoint rule."""

from __future__ import annotations

from .primitive import bind


def erf(x):
    """Elementwise error function; integers are promoted to f32.

    dq.erf(np.array([0.5], np.float32))      # array([0.5205], dtype=float32)
    """
    return bind("erf", [x], name="erf", float_result=True)
