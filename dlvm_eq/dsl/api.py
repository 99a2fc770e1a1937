"""The user's entry point into tracing: `make_ir` (like `jax.make_jaxpr`).

    print(dq.make_ir(loss)(w, x))          # module "loss" ... func @loss: (...) -> f32 { ... }

`dq.jit` (trace, then compile) lives with the pipeline (dlvm_eq/pipeline/jit.py); it traces
through `traced_module` here.
"""

from __future__ import annotations

import functools

from ..ir.control_flow import module_with_bodies
from ..ir.module import Module
from ..ir.verifier import verify
from .pytree import tree_flatten
from .tracing import function_name, trace
from .tree_args import flat_function, flatten_args, leaf_names


def make_ir(fn, name: str | None = None):
    """`make_ir(fn)(*example_args) -> Module` holding one function named after `fn`. Example
    args are numpy arrays, Python or numpy scalars, `dq.spec(shape, dtype)`, or pytrees of
    them (dicts, lists, tuples, namedtuples: one IR parameter per leaf)."""

    def build(*example_args) -> Module:
        return traced_module(fn, example_args, name)[0]

    functools.update_wrapper(build, fn, updated=())
    return build


def traced_module(fn, args, name=None, leaves=None) -> tuple[Module, object]:
    """(verified Module of one function, the result's tree structure): `fn` traced on the
    leaves of its pytree arguments (`leaves`: already flattened by the caller)."""
    if leaves is None:
        leaves, in_tree = flatten_args(args, fn, "make_ir")
    else:
        in_tree = tree_flatten(tuple(args))[1]
    flat, out_trees = flat_function(fn, in_tree)
    function = trace(flat, leaves, name=name or function_name(fn), names=leaf_names(fn, in_tree))
    code = getattr(fn, "__code__", None)
    if code is not None:  # the user's def, not the flattening wrapper
        function.location = (code.co_filename, code.co_firstlineno, 1)
    module = Module(function.name)
    module_with_bodies(module, function)  # and the bodies of its loops and branches
    verify(module)
    return module, out_trees[0]
