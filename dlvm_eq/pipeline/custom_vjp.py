"""`dq.custom_vjp`: a function whose gradient is the user's Python adjoint, as `jax.custom_vjp`.

    @dq.custom_vjp
    def clip_gradient(x):
        return x
    clip_gradient.defvjp(lambda x: (x, None), lambda res, g: (dq.clip(g, -1.0, 1.0),))

Inside a trace the call is spelled with ops the reverse pass already knows, so the whole
program still goes through one e-graph:

    y = stop_gradient(f(x)) + B^T(x - stop_gradient(x))

where B = (g -> bwd(res, g)) is the user's VJP (linear in g) and B^T is its transpose, built by
differentiating bwd with respect to g. The correction is zero in value; its derivative with
respect to x is B^T, so the adjoint reaching x is (B^T)^T g = bwd(res, g). Residuals are
constants to the gradient (stop_gradient), as in JAX. Outside a trace `fn` runs as it is.
"""

from __future__ import annotations

import functools
import threading

from ..ad.driver import AdjointError
from ..dsl.constants import zeros_like
from ..dsl.context import is_tracing
from ..dsl.ops import stop_gradient
from ..dsl.pytree import tree_flatten, tree_map, tree_unflatten
from ..dsl.tensor import Tensor
from ..dsl.tracing import type_of
from .differentiate import vjp


class custom_vjp:
    """`f = custom_vjp(fn); f.defvjp(fwd, bwd)`: fwd(*args) -> (out, residuals), bwd(residuals,
    cotangent) -> one cotangent per argument (a tuple). Arguments are float arrays (pytrees)."""

    def __init__(self, fn):
        self.fn = fn
        self.fwd = self.bwd = None
        self._inside = threading.local()  # fwd calling f itself (JAX's usual fwd) runs fn
        functools.update_wrapper(self, fn, updated=())

    def defvjp(self, fwd, bwd):
        self.fwd, self.bwd = fwd, bwd
        return self

    def __call__(self, *args):
        if self.fwd is None:
            raise AdjointError(f"custom_vjp {getattr(self.fn, '__name__', '')}: call defvjp first")
        leaves, _ = tree_flatten(args)
        inside = getattr(self._inside, "depth", 0)
        if inside or not is_tracing() or not any(isinstance(x, Tensor) for x in leaves):
            return self.fn(*args)
        for x in leaves:
            if not type_of(x).dtype.is_float:
                raise AdjointError(f"custom_vjp: argument {type_of(x)} is not a float array")
        self._inside.depth = inside + 1
        try:
            out, res = self.fwd(*args)
        finally:
            self._inside.depth = inside
        res = tree_map(lambda r: stop_gradient(r) if isinstance(r, Tensor) else r, res)
        out_leaves, out_tree = tree_flatten(out)
        g0 = tree_unflatten(out_tree, [zeros_like(o) for o in out_leaves])

        def backward(g):
            cts = self.bwd(res, g)
            if not isinstance(cts, tuple) or len(cts) != len(args):
                raise AdjointError(
                    f"custom_vjp: bwd must return a tuple of {len(args)} cotangent(s), one per "
                    f"argument, not {type(cts).__name__}"
                )
            return tuple(
                tree_map(zeros_like, a) if c is None else c for a, c in zip(args, cts)
            )  # None: no gradient for that argument

        # value zero, derivative the identity: where the user's adjoint enters the program
        moves = tuple(tree_map(lambda a: a - stop_gradient(a), a) for a in args)
        _, transposed = vjp(backward, g0)
        (correction,) = transposed(moves)
        fixed = [stop_gradient(o) + c for o, c in zip(out_leaves, tree_flatten(correction)[0])]
        return tree_unflatten(out_tree, fixed)


__all__ = ["custom_vjp"]
