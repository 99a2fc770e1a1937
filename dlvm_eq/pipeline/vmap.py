"""`dq.vmap`: JAX's vectorizing map. The function is traced on one example, the traced IR is
batched op by op by the registry's batching rules (ir/batching.py), and the batched program is
inlined into the enclosing trace, or compiled by jit: matmuls become batched products, and
nothing loops over the examples.

    per_example = dq.vmap(dq.grad(loss), in_axes=(None, 0, 0))(w, xs, ys)   # per-example grads
    dq.vmap(dq.vmap(f))(x)                         # nested: two batch axes
    dq.jit(dq.vmap(f, in_axes=1, out_axes=1))(x)   # batch axis 1 in and out

in_axes: an int or None for every argument, or a tuple of them, one per positional argument
(an int or None applies to every leaf of that argument's pytree). out_axes: an int or None for
every output leaf, or a tuple of them, one per element of a tuple result; None only for an
output that does not depend on a batched argument.
"""

from __future__ import annotations

import functools

import numpy as np

from ..dsl.context import is_tracing
from ..dsl.ops import transpose
from ..dsl.primitive import bind
from ..dsl.pytree import tree_unflatten
from ..dsl.tracing import call_function, trace_closure, type_of
from ..dsl.tree_args import flat_function, flatten_args, leaf_names
from ..errors import DlvmError
from ..ir.batching import BatchError, batch_function
from ..ir.types import TensorType
from .jit import jit


def _per_argument(spec, count: int, who: str, what: str) -> list:
    if spec is None or isinstance(spec, (int, np.integer)):
        return [spec] * count
    spec = list(spec)
    if len(spec) != count:
        raise BatchError(f"{who}: {what} has {len(spec)} entries for {count} arguments")
    return spec


def _leaf_axes(in_axes, in_tree) -> list:
    """One axis (or None) per leaf of the argument tuple."""
    per_arg = _per_argument(in_axes, len(in_tree.children), "vmap", "in_axes")
    out = []
    for axis, sub in zip(per_arg, in_tree.children):
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise BatchError(f"vmap: in_axes entries are ints or None, not {axis!r}")
        out += [axis] * sub.num_leaves
    return out


def _move(x, source: int, dest: int):
    """x with axis `source` moved to `dest` (a traced transpose, or numpy's moveaxis)."""
    ndim = len(type_of(x).shape)
    if source == dest:
        return x
    perm = [i for i in range(ndim) if i != source]
    perm.insert(dest, source)
    return transpose(x, perm)


def _normalize(axis: int, ndim: int, what: str) -> int:
    if not -ndim <= axis < ndim:
        raise BatchError(f"vmap: {what} axis {axis} is out of range for rank {ndim}")
    return axis % ndim


def _batched_call(fn, args, in_axes, out_axes):
    leaves, in_tree = flatten_args(args, fn, "vmap")
    axes = _leaf_axes(in_axes, in_tree)
    size = None
    moved, types = [], []
    for x, axis in zip(leaves, axes):
        t = type_of(x)
        if axis is None:
            moved.append(x)
            types.append(t)
            continue
        axis = _normalize(int(axis), max(len(t.shape), 1), "an in_axes")
        if len(t.shape) == 0:
            raise BatchError("vmap: a scalar argument cannot be batched (use in_axes=None)")
        if size is not None and t.shape[axis] != size:
            raise BatchError(
                f"vmap: batched arguments have different sizes along their axes: {size} and "
                f"{t.shape[axis]}"
            )
        size = t.shape[axis]
        moved.append(_move(x, axis, 0))
        types.append(TensorType(t.shape[:axis] + t.shape[axis + 1 :], t.dtype))
    if size is None:
        raise BatchError("vmap: in_axes batches no argument")
    flat, out_trees = flat_function(fn, in_tree)
    example, captured = trace_closure(flat, types, names=leaf_names(fn, in_tree))
    batched = [a is not None for a in axes] + [False] * len(captured)
    program, out_batched = batch_function(example, batched, size, broadcast_outputs=False)
    out = call_function(program, *moved, *captured)
    outs = list(out) if isinstance(out, tuple) else [out]
    out_tree = out_trees[0]
    if out_tree.kind == "leaf" or isinstance(out_axes, (int, np.integer)) or out_axes is None:
        per_leaf = [out_axes] * len(outs)
    else:
        per_leaf = []
        for axis, sub in zip(
            _per_argument(out_axes, len(out_tree.children), "vmap", "out_axes"), out_tree.children
        ):
            per_leaf += [axis] * sub.num_leaves
    result = []
    for o, b, axis in zip(outs, out_batched, per_leaf):
        if axis is None:
            if b:
                raise BatchError("vmap: out_axes None for an output that depends on a batch")
            result.append(o)
            continue
        if not b:
            shape = type_of(o).shape
            o = bind("broadcast", [o], name="vmap", shape=(size, *shape))
        result.append(_move(o, 0, _normalize(int(axis), len(type_of(o).shape), "an out_axes")))
    return tree_unflatten(out_tree, result)


def vmap(fn, in_axes=0, out_axes=0):
    """`jax.vmap(fn, in_axes, out_axes)`: fn mapped over an axis of its arguments, batched by
    a rule per op (see the module docstring)."""

    def run(*args):
        return _batched_call(fn, args, in_axes, out_axes)

    functools.update_wrapper(run, fn, updated=())
    run.__name__ = f"{getattr(fn, '__name__', 'f')}_vmap".replace("<lambda>", "lambda")
    compiled = jit(run)

    def call(*args):
        if not args:
            raise DlvmError("vmap: the mapped function needs at least one argument")
        return run(*args) if is_tracing() else compiled(*args)

    functools.update_wrapper(call, fn, updated=())
    call.lower = compiled.lower
    return call


__all__ = ["vmap"]
