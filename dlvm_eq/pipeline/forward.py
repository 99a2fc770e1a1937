"""Forward mode and Jacobians, JAX's signatures: `jvp`, `linearize`, `jacfwd`, `jacrev`,
`hessian`.

Forward mode is the adjoint transposed: the VJP `ct -> J^T ct` is linear in the cotangent, so
its own VJP with cotangent t is `J t`. Both adjoints are built by the e-graph from the rules
of rules/adjoint.egg (grad of grad works for every op with a rule), and the program that comes
out is optimized there with the forward pass, like any gradient. Jacobians map vjp (jacrev) or
jvp (jacfwd) over the basis vectors with dq.vmap: one batched program, not a loop.

    y, ty = dq.jvp(f, (x,), (t,))             # f(x), J(x) t
    y, f_jvp = dq.linearize(f, x); f_jvp(t)   # the same, J t for any t at the same x
    dq.jacrev(f)(x).shape == f(x).shape + x.shape
    dq.hessian(loss)(w)                       # jacfwd(jacrev(loss))
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..ad.driver import AdjointError
from ..dsl.constants import zeros_like
from ..dsl.context import is_tracing
from ..dsl.ops import reshape, transpose
from ..dsl.pytree import tree_flatten, tree_unflatten
from ..dsl.tracing import type_of
from .differentiate import vjp
from .jit import jit
from .vmap import vmap


def _traced_or_jitted(run, fn, suffix: str):
    """run itself inside a trace; outside, run compiled by jit (once per argument shapes)."""
    functools.update_wrapper(run, fn, updated=())
    run.__name__ = f"{getattr(fn, '__name__', 'f')}_{suffix}".replace("<lambda>", "lambda")
    compiled = jit(run)

    def call(*args):
        return run(*args) if is_tracing() else compiled(*args)

    functools.update_wrapper(call, fn, updated=())
    call.lower = compiled.lower  # type: ignore[attr-defined]  # an attribute on a function, as Jitted.lower
    return call


def _check_float(leaves, who: str) -> None:
    for x in leaves:
        if not type_of(x).dtype.is_float:
            raise AdjointError(f"{who}: primal {type_of(x)} is not a float array")


def _jvp_traced(fn, primals: tuple, tangents: tuple):
    out, f_vjp = vjp(fn, *primals)
    out_leaves, out_tree = tree_flatten(out)
    ct0 = tree_unflatten(out_tree, [zeros_like(o) for o in out_leaves])
    # ct -> J^T ct is linear: its VJP with cotangent `tangents` is J tangents
    _, transposed = vjp(lambda ct: f_vjp(ct), ct0)
    (t_out,) = transposed(tangents)
    return out, t_out


def jvp(fn, primals, tangents):
    """`(fn(*primals), J tangents)`, like `jax.jvp`: primals and tangents are tuples (of
    pytrees) of one structure; every primal leaf is a float array."""
    primals, tangents = tuple(primals), tuple(tangents)
    p_leaves, p_tree = tree_flatten(primals)
    t_leaves, t_tree = tree_flatten(tangents)
    if p_tree != t_tree:
        raise AdjointError(f"jvp: tangents {t_tree} do not have the primals' structure {p_tree}")
    _check_float(p_leaves, "jvp")
    # a tangent has its primal's dtype (a Python float for an f64 primal is f64)
    t_leaves = [
        t if hasattr(t, "trace") else np.asarray(t, dtype=type_of(p).dtype.numpy)
        for p, t in zip(p_leaves, t_leaves)
    ]
    tangents = tree_unflatten(t_tree, t_leaves)
    if is_tracing():
        return _jvp_traced(fn, primals, tangents)
    return _jvp_jitted(fn)(primals, tangents)


@functools.lru_cache(maxsize=64)
def _jvp_jitted(fn):
    def run(primals, tangents):
        return _jvp_traced(fn, primals, tangents)

    # named after fn (the IR's name), but not wrapping it: jit checks calls against run's
    # own signature
    run.__name__ = f"{getattr(fn, '__name__', 'f')}_jvp".replace("<lambda>", "lambda")
    return jit(run)


def linearize(fn, *primals):
    """`(fn(*primals), f_jvp)` with `f_jvp(*tangents) = J tangents` at these primals, like
    `jax.linearize` (each call of f_jvp runs one compiled forward-mode program)."""
    out, _ = jvp(fn, primals, tuple(zeros_like(p) for p in primals))

    def f_jvp(*tangents):
        return jvp(fn, primals, tangents)[1]

    return out, f_jvp


def _argnums(argnums, n: int, who: str) -> tuple[tuple[int, ...], bool]:
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    if any(not -n <= a < n for a in nums):
        raise AdjointError(f"{who}: argnums {argnums!r} is out of range for {n} arguments")
    return tuple(a % n for a in nums), single


def _basis(t, k: int) -> np.ndarray:
    """The k unit vectors of a tensor type's elements, as (k, *t.shape)."""
    return np.eye(k, dtype=t.dtype.numpy).reshape((k, *t.shape))


def _one_array(out, who: str):
    leaves, tree = tree_flatten(out)
    if tree.kind != "leaf":
        raise AdjointError(f"{who}: the function must return one array, not {tree}")
    return leaves[0]


def jacrev(fn, argnums=0):
    """The Jacobian of fn's (one array) output with respect to argument(s) `argnums`, by
    reverse mode: the VJP mapped over the output's basis. Shape: out.shape + arg.shape."""

    def run(*args):
        nums, single = _argnums(argnums, len(args), "jacrev")

        def partial(*xs):
            full = list(args)
            for n, x in zip(nums, xs):
                full[n] = x
            return fn(*full)

        out, f_vjp = vjp(partial, *(args[n] for n in nums))
        t_out = type_of(_one_array(out, "jacrev"))
        rows = vmap(lambda ct: f_vjp(ct))(_basis(t_out, max(math.prod(t_out.shape), 1)))
        jacs = tuple(reshape(r, t_out.shape + type_of(args[n]).shape) for r, n in zip(rows, nums))
        return jacs[0] if single else jacs

    return _traced_or_jitted(run, fn, "jacrev")


def jacfwd(fn, argnums=0):
    """The Jacobian of fn's (one array) output with respect to argument(s) `argnums`, by
    forward mode: the JVP mapped over the argument's basis. Shape: out.shape + arg.shape."""

    def run(*args):
        nums, single = _argnums(argnums, len(args), "jacfwd")
        jacs = []
        for n in nums:
            t_in = type_of(args[n])

            def push(t, n=n):
                def along(x):
                    full = list(args)
                    full[n] = x
                    return fn(*full)

                return _one_array(jvp(along, (args[n],), (t,))[1], "jacfwd")

            k = max(math.prod(t_in.shape), 1)
            cols = vmap(push)(_basis(t_in, k))  # (k, *out.shape)
            rank = len(type_of(cols).shape)
            last = transpose(cols, tuple(range(1, rank)) + (0,)) if rank > 1 else cols
            jacs.append(reshape(last, type_of(cols).shape[1:] + t_in.shape))
        return jacs[0] if single else tuple(jacs)

    return _traced_or_jitted(run, fn, "jacfwd")


def hessian(fn, argnums=0):
    """`jacfwd(jacrev(fn, argnums), argnums)`, as `jax.hessian`."""
    return jacfwd(jacrev(fn, argnums), argnums)


__all__ = ["hessian", "jacfwd", "jacrev", "jvp", "linearize"]
