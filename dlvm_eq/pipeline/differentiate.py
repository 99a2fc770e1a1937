"""JAX's differentiation API over traced IR: `grad`, `value_and_grad`, `vjp`.

    dq.grad(loss)(w, x)                                  # d loss / d w, a numpy array
    dq.value_and_grad(loss, argnums=(0, 1))(w, b, x)     # (loss, (d/dw, d/db))
    out, f_vjp = dq.vjp(f, x); (dx,) = f_vjp(cotangent)
    dq.jit(dq.grad(loss))(w, x)                          # traced and differentiated once per shapes
    dq.grad(lambda x: dq.sum(dq.grad(f)(x) * v))(x)      # a Hessian-vector product

On numpy arrays a differentiated function is traced once per argument shapes/dtypes, and its
adjoint program runs on the jit back end (cached). Inside a trace (under dq.jit, or inside
another dq.grad) it traces `fn`, differentiates the IR in the e-graph, and inlines the adjoint
program into the enclosing trace with `call_function`; since adjoint programs use only ops
that have adjoint rules, grad of grad works. Trace (dsl) + differentiate (ad) + jit: it lives
with the pipeline.
"""
from __future__ import annotations

import functools

import numpy as np

from ..ad.driver import AdjointError, adjoint_function
from ..dsl.context import is_tracing
from ..dsl.tensor import Tensor
from ..dsl.tracing import call_function, trace_closure, type_of
from ..ir.types import TensorType, TupleType
from .jit import jit


def _argnums(argnums, n: int, who: str) -> tuple[tuple[int, ...], bool]:
    """(normalized argnums, whether a single int was given)."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    out = []
    for a in nums:
        if not isinstance(a, int) or not -n <= a < n:
            raise AdjointError(f"{who}: argnums {argnums!r} is out of range for {n} positional "
                               f"argument{'s' * (n != 1)}")
        out.append(a % n)
    if len(set(out)) != len(out):
        raise AdjointError(f"{who}: argnums {argnums!r} repeats an argument")
    return tuple(out), single


def _trace(fn, args):
    """fn traced on args' types: (Function, tensors it captured from enclosing traces)."""
    return trace_closure(fn, [type_of(a) for a in args])


def _differentiated(fn, argnums, with_value: bool, who: str):
    def traced(*args):
        nums, single = _argnums(argnums, len(args), who)
        forward, captured = _trace(fn, args)
        t = forward.result_type
        if not (isinstance(t, TensorType) and t.shape == () and t.dtype.is_float):
            raise AdjointError(f"{who}: {getattr(fn, '__name__', 'the function')} must return a "
                               f"float scalar, but it returns {t}; use dq.vjp for other outputs")
        adj = adjoint_function(None, forward, wrt=nums, keeping=(0,), tuple_result=True)
        value, *grads = call_function(adj, *args, *captured)
        return value, (grads[0] if single else tuple(grads))

    def flat(*args):                      # what the jit back end runs: a flat tuple
        value, grads = traced(*args)
        return (value,) + (grads if isinstance(grads, tuple) else (grads,))

    functools.update_wrapper(flat, fn, updated=())
    flat.__name__ = f"{getattr(fn, '__name__', 'f')}_grad".replace("<lambda>", "lambda")
    compiled = jit(flat)

    def call(*args):
        if is_tracing():
            value, grads = traced(*args)
        else:
            _, single = _argnums(argnums, len(args), who)
            value, *grads = compiled(*args)
            grads = grads[0] if single else tuple(grads)
        return (value, grads) if with_value else grads

    functools.update_wrapper(call, fn, updated=())
    call.lower = compiled.lower           # the Module that runs, like Jitted.lower
    return call


def value_and_grad(fn, argnums=0):
    """`(fn(*args), gradient)`; the gradient is a tuple when argnums is a tuple. fn must return
    a float scalar."""
    return _differentiated(fn, argnums, True, "value_and_grad")


def grad(fn, argnums=0):
    """The gradient of a float-scalar `fn` with respect to argument `argnums` (a tuple of
    gradients for a tuple of argnums), like `jax.grad`."""
    return _differentiated(fn, argnums, False, "grad")


def vjp(fn, *primals):
    """`(fn(*primals), vjp_fn)`; `vjp_fn(cotangent)` returns one gradient per primal (None for
    non-float primals). For a tuple-valued fn the cotangent is a tuple (entries for non-float
    outputs are ignored)."""
    if not primals:
        raise AdjointError("vjp: needs at least one primal")
    forward, captured = _trace(fn, primals)
    wrt = tuple(i for i, a in enumerate(primals) if type_of(a).dtype.is_float)
    if not wrt:
        raise AdjointError("vjp: no float primal to differentiate")
    adj = adjoint_function(None, forward, wrt=wrt, seedable=True, tuple_result=True)
    many = isinstance(forward.result_type, TupleType)
    if is_tracing():
        out = call_function(forward, *primals, *captured)
        run_adjoint = functools.partial(call_function, adj)
    else:
        out = jit(lambda *a: call_function(forward, *a))(*primals)
        run_adjoint = jit(lambda *a: call_function(adj, *a))
    out_types = forward.result_type.elements if many else (forward.result_type,)
    n_out = len(out_types)

    def vjp_fn(cotangent):
        cts = tuple(cotangent) if many else (cotangent,)
        if len(cts) != n_out:
            raise AdjointError(f"vjp_fn: expected {n_out} cotangent(s), got {len(cts)}")
        # a cotangent has its output's type (a Python float for an f64 output is f64)
        cts = tuple(c if isinstance(c, Tensor) else np.asarray(c, dtype=t.dtype.numpy)
                    for c, t in zip(cts, out_types) if t.dtype.is_float)
        grads = run_adjoint(*primals, *captured, *cts)
        grads = iter(grads if isinstance(grads, tuple) else (grads,))
        return tuple(next(grads) if i in wrt else None for i in range(len(primals)))

    return out, vjp_fn
