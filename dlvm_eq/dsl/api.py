"""The user's entry point into tracing: `make_ir` (like `jax.make_jaxpr`).

    print(dq.make_ir(loss)(w, x))          # module "loss" ... func @loss: (...) -> f32 { ... }

`dq.jit` (trace, then compile) lives with the pipeline (dlvm_eq/pipeline/jit.py).
"""
from __future__ import annotations

import functools

from ..ir.module import Module
from ..ir.verifier import verify
from .tracing import function_name, trace


def make_ir(fn, name: str | None = None):
    """`make_ir(fn)(*example_args) -> Module` holding one function named after `fn`. Example
    args are numpy arrays, Python or numpy scalars, or `dq.spec(shape, dtype)`."""
    def build(*example_args) -> Module:
        function = trace(fn, example_args, name=name or function_name(fn))
        module = Module(function.name)
        module.add(function)
        verify(module)
        return module
    functools.update_wrapper(build, fn, updated=())
    return build
