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

import contextvars
import functools

import numpy as np

from ..ad.driver import AdjointError, adjoint_function, adjoint_reports
from ..cache import watching_time_cuts
from ..dsl.context import current_trace, is_tracing
from ..dsl.pytree import tree_flatten, tree_unflatten
from ..dsl.tensor import Tensor
from ..dsl.tracing import call_function, trace_closure, type_of
from ..dsl.tree_args import flat_function, flatten_args, leaf_names
from ..ir.types import TensorType, TupleType
from .jit import jit
from .targets import (
    DEFAULT_TARGET,
    optimizes,
    saturated_record,
    traced_target,
    will_be_optimized,
)
from .timing import phase


def _argnums(argnums, n: int, who: str) -> tuple[tuple[int, ...], bool]:
    """(normalized argnums, whether a single int was given)."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    out = []
    for a in nums:
        if not isinstance(a, int) or not -n <= a < n:
            raise AdjointError(
                f"{who}: argnums {argnums!r} is out of range for {n} positional "
                f"argument{'s' * (n != 1)}"
            )
        out.append(a % n)
    if len(set(out)) != len(out):
        raise AdjointError(f"{who}: argnums {argnums!r} repeats an argument")
    return tuple(out), single


# Where the algebra runs on a gradient. With EXPAND_ONLY_UNDER_JIT, under a jit whose back end
# optimizes the traced module as a whole (cpu, gpu: targets.will_be_optimized), an outermost
# gradient is only expanded here (the adjoint rules) and the algebra saturates once over the
# whole step. Off: the adjoint and the algebra saturate together where the gradient is made,
# and the jitted module is not optimized again where it is that adjoint plus elementwise ops
# (targets.Saturated, issue 32: the second pass found nothing on the benchmark steps). Off
# because expanding alone loses forms the joint e-graph finds: the MLP step's
# softmax-cross-entropy gradient came out as 8 kernels instead of 7 (tests/test_gemm.py), and
# its cold compile was no faster (2.8 s against 1.8-2.6 s with both passes, same loaded 2-core
# machine). A gradient inside another one's trace (grad of
# grad) is always optimized first: the outer adjoint then differentiates the smaller program.
EXPAND_ONLY_UNDER_JIT = False
_NESTING = contextvars.ContextVar("dlvm_eq_gradient_nesting", default=0)


def _outermost() -> bool:
    """Whether the gradient being traced is not inside another's trace. (Closures read the
    nesting through this function: a ContextVar that a closure names is captured when Ray's
    cloudpickle sends a compiled step to a worker, and cannot be pickled.)"""
    return _NESTING.get() == 0


def _optimize_adjoint(later: bool) -> bool:
    """Whether the adjoint being made is optimized now; `later`: the module will be."""
    return not (EXPAND_ONLY_UNDER_JIT and later and _NESTING.get() == 0)


class _Guard:
    """The never-slower guard (never_slower.guard_for) for `target`, loaded when first asked:
    a warm compile reads its adjoint from the cache and never asks (tests/test_warm_compile)."""

    def __init__(self, target: str) -> None:
        self.target = target

    @property
    def error(self) -> float:
        from .never_slower import PREDICTION_ERROR

        return PREDICTION_ERROR

    def __call__(self, *args):
        from .never_slower import guard_for

        return guard_for(self.target)(*args)


def _trace(fn, args, who: str):
    """fn traced on the leaves of its pytree args: (Function, tensors it captured from enclosing
    traces, the args' leaves, their structure, the result's structure)."""
    leaves, in_tree = flatten_args(args, fn, who)
    flat, out_trees = flat_function(fn, in_tree)
    forward, captured = trace_closure(
        flat, [type_of(x) for x in leaves], names=leaf_names(fn, in_tree)
    )
    return forward, captured, leaves, in_tree, out_trees[0]


def _leaf_ranges(in_tree) -> list[range]:
    """The leaf indices of each argument of a flattened argument tuple."""
    ranges, start = [], 0
    for sub in in_tree.children:
        ranges.append(range(start, start + sub.num_leaves))
        start += sub.num_leaves
    return ranges


def _trace_nested(fn, args, who: str):
    """_trace one gradient level deeper. (A module-level function, so that the closures that
    call it pickle by reference: Ray ships jitted gradients to its workers, and a ContextVar
    named in a closure cannot be pickled.)"""
    token = _NESTING.set(_NESTING.get() + 1)
    try:
        return _trace(fn, args, who)
    finally:
        _NESTING.reset(token)


def _differentiated(fn, argnums, with_value: bool, who: str, has_aux: bool = False):
    def traced(*args):
        nums, single = _argnums(argnums, len(args), who)
        forward, captured, leaves, in_tree, out_tree = _trace_nested(fn, args, who)
        t = forward.result_type
        if has_aux:  # (loss, aux): differentiate output 0, return the aux leaves as they are
            if out_tree.kind == "leaf" or len(out_tree.children) != 2:
                raise AdjointError(
                    f"{who}: with has_aux=True, {getattr(fn, '__name__', 'the function')} "
                    f"must return a pair (loss, aux), not {out_tree}"
                )
            t = t.elements[0] if isinstance(t, TupleType) else t
        if not (isinstance(t, TensorType) and t.shape == () and t.dtype.is_float):
            raise AdjointError(
                f"{who}: {getattr(fn, '__name__', 'the function')} must return a "
                f"float scalar, but it returns {t}; use dq.vjp for other outputs"
            )
        ranges = _leaf_ranges(in_tree)
        wrt = tuple(i for n in nums for i in ranges[n])  # whole subtrees, in argnums order
        kept = (0,) + tuple(range(1, 1 + out_tree.children[1].num_leaves)) if has_aux else (0,)
        optimize = _optimize_adjoint(will_be_optimized())
        # issue 32: an outermost adjoint saturated whole (the shipped schedule, no time cut)
        # goes into the jit's trace as saturated: the module's own pass may skip it. Its
        # e-graph then also runs the attention rules, behind the guard the module's pass had
        record = saturated_record() if optimize and _outermost() else None
        with phase("adjoint"), watching_time_cuts() as cuts, adjoint_reports() as reports:
            adj = adjoint_function(
                None,
                forward,
                wrt=wrt,
                from_index=0 if has_aux else None,
                keeping=kept,
                tuple_result=True,
                optimize=optimize,
                target=traced_target(),
                guard=None if record is None else _Guard(traced_target()),
            )
        record = None if cuts else record
        start = len(current_trace().builder.body) if record is not None else 0
        value, *flat_grads = call_function(adj, *leaves, *captured)
        if record is not None:
            # the outermost adjoint's report comes last (declared ones it applied come first)
            record.add(current_trace().builder.body[start:], reports[-1] if reports else None)
        if has_aux:
            aux_leaves, flat_grads = flat_grads[: len(kept) - 1], flat_grads[len(kept) - 1 :]
            value = (value, tree_unflatten(out_tree.children[1], aux_leaves))
        flat_grads = iter(flat_grads)
        grads = tuple(
            tree_unflatten(in_tree.children[n], [next(flat_grads) for _ in ranges[n]]) for n in nums
        )  # each gradient has its argument's structure
        grads = grads[0] if single else grads
        return value, grads

    def traced_grads(*args):
        value, grads = traced(*args)
        return (grads, value[1]) if has_aux else grads

    # grad's program returns the gradients only: the loss is not computed where the gradient
    # does not need it (its final reduction, say)
    run = traced if with_value else traced_grads
    functools.update_wrapper(run, fn, updated=())  # jit names the IR and its parameters
    run.__name__ = f"{getattr(fn, '__name__', 'f')}_grad".replace("<lambda>", "lambda")
    compiled = jit(run)

    def call(*args):
        return run(*args) if is_tracing() else compiled(*args)

    functools.update_wrapper(call, fn, updated=())
    call.lower = compiled.lower  # type: ignore[attr-defined]  # an attribute on a function, as Jitted.lower
    return call


def value_and_grad(fn, argnums=0, has_aux=False):
    """`(fn(*args), gradient)`; the gradient is a tuple when argnums is a tuple. fn must return
    a float scalar, or with `has_aux` a pair (scalar, aux): then `((value, aux), gradient)`."""
    return _differentiated(fn, argnums, True, "value_and_grad", has_aux)


def grad(fn, argnums=0, has_aux=False):
    """The gradient of a float-scalar `fn` with respect to argument `argnums` (a tuple of
    gradients for a tuple of argnums), like `jax.grad`; with `has_aux`, fn returns (scalar,
    aux) and grad returns `(gradient, aux)`."""
    return _differentiated(fn, argnums, False, "grad", has_aux)


def vjp(fn, *primals):
    """`(fn(*primals), vjp_fn)`; `vjp_fn(cotangent)` returns one gradient per primal, each with
    its primal's structure (None for non-float leaves). Primals and outputs may be pytrees; the
    cotangent has the output's structure (entries for non-float outputs are ignored)."""
    if not primals:
        raise AdjointError("vjp: needs at least one primal")
    forward, captured, leaves, in_tree, out_tree = _trace_nested(fn, primals, "vjp")
    wrt = tuple(i for i, a in enumerate(leaves) if type_of(a).dtype.is_float)
    if not wrt:
        raise AdjointError("vjp: no float primal to differentiate")
    # outside a trace the adjoint runs under jit's default target, which optimizes it
    later = will_be_optimized() if is_tracing() else optimizes(DEFAULT_TARGET)
    with phase("adjoint"):
        adj = adjoint_function(
            None,
            forward,
            wrt=wrt,
            seedable=True,
            tuple_result=True,
            optimize=_optimize_adjoint(later),
            target=traced_target(),
        )
    many = isinstance(forward.result_type, TupleType)
    if is_tracing():
        out = call_function(forward, *leaves, *captured)
        run_adjoint = functools.partial(call_function, adj)
    else:
        out = jit(lambda *a: call_function(forward, *a))(*leaves)
        run_adjoint = jit(lambda *a: call_function(adj, *a))
    out_types = forward.result_type.elements if many else (forward.result_type,)
    out = tree_unflatten(out_tree, out if many else (out,))

    def vjp_fn(cotangent):
        cts, ct_tree = tree_flatten(cotangent)
        if ct_tree != out_tree:
            raise AdjointError(
                f"vjp_fn: expected {len(out_types)} cotangent(s) in the "
                f"output's structure {out_tree}, got {ct_tree}"
            )
        # a cotangent has its output's type (a Python float for an f64 output is f64)
        cts = tuple(
            c if isinstance(c, Tensor) else np.asarray(c, dtype=t.dtype.numpy)
            for c, t in zip(cts, out_types)
            if t.dtype.is_float
        )
        grads = run_adjoint(*leaves, *captured, *cts)
        grads = iter(grads if isinstance(grads, tuple) else (grads,))
        flat = [next(grads) if i in wrt else None for i in range(len(leaves))]
        return tree_unflatten(in_tree, flat)  # a tuple: one gradient tree per primal

    return out, vjp_fn
