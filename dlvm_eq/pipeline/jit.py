"""`dq.jit`: trace a Python function per argument shapes/dtypes, then compile the traced
module for a target (pipeline/targets.py).

    f = dq.jit(loss)                       # traced and compiled on the first call,
    f(w, x); f(w, x)                       # then cached per argument shapes and dtypes
    f(params, x)                           # pytrees (dicts, lists, tuples, namedtuples) too
    f.lower(w, x)                          # the Module it compiled
    f.report(w, x)                         # what compiling did (cpu/gpu)
    dq.jit(f, rules=["my.egg"], verify_rules=True)   # the user's rules, proven first

Shared state (threads): a Jitted's `_cache` holds only complete entries; `_building` (under
`_lock`) gives each signature one builder, so concurrent first calls compile once.
"""

from __future__ import annotations

import functools
import os
import threading

import numpy as np

from ..dsl.api import traced_module
from ..dsl.pytree import is_flat, tree_flatten, tree_unflatten
from ..dsl.tensor import Tensor
from ..dsl.tree_args import bind_arguments, check_arity, leaf_types, signature_text
from ..errors import DlvmError
from ..ir.module import Module
from .targets import DEFAULT_TARGET, backend, compile_for, traced_for
from .timing import compile_phases, phase


def _signature(args, fn) -> tuple[tuple, list | None]:
    """(cache key, leaves) of a call: the arguments' tree structure and each leaf's shape and
    dtype. Plain numpy arrays take a fast path (a call's dispatch is on the hot path of a
    training loop; leaves None: the arguments are the leaves); pytrees are flattened, their
    leaves checked."""
    if all(type(a) is np.ndarray for a in args):
        return tuple((a.shape, a.dtype) for a in args), None
    leaves, in_tree = tree_flatten(tuple(args))
    if all(type(x) is np.ndarray for x in leaves):
        return (in_tree, tuple((x.shape, x.dtype) for x in leaves)), leaves
    types = leaf_types(leaves, in_tree, fn, "jit")
    return (in_tree, tuple((t.shape, t.dtype) for t in types)), leaves


class Jitted:
    """A function compiled on first call for each distinct argument tree structure and leaf
    shapes/dtypes; arguments and results may be pytrees (dicts, lists, tuples, namedtuples)."""

    def __init__(self, fn, target: str = DEFAULT_TARGET, rules=(), verify_rules: bool = False):
        backend(target)  # an unknown target is a DlvmError here, not at the first call
        self.fn, self.target = fn, target
        self.rules = (rules,) if isinstance(rules, (str, os.PathLike)) else tuple(rules or ())
        self.verify_rules = verify_rules
        if verify_rules:  # refused here, before any call compiles with them
            from .verified_rules import check_user_rules  # sympy loads only when asked

            check_user_rules(self.rules, "jit")
        self._cache: dict[tuple, tuple] = {}
        # one compile per signature: the first caller builds the entry (only complete entries
        # enter _cache), a concurrent caller of the same signature waits for it
        self._lock = threading.Lock()
        self._building: dict[tuple, threading.RLock] = {}
        functools.update_wrapper(self, fn, updated=())

    def _positional(self, args, kwargs):
        if not kwargs:
            return args
        bound = bind_arguments(self.fn, args, kwargs, "jit")
        if bound is None:
            raise DlvmError(f"jit: {signature_text(self.fn)} takes no keyword arguments")
        if bound.kwargs:
            raise DlvmError("jit: keyword-only arguments are not supported")
        return bound.args

    def _entry(self, args, key, leaves) -> tuple:
        """The cache entry (module, compiled, result tree) for a call's signature `key`."""
        entry = self._cache.get(key)
        if entry is not None:
            return entry
        with self._lock:
            building = self._building.setdefault(key, threading.RLock())
        try:
            with building:
                entry = self._cache.get(key)
                if entry is None:
                    entry = self._cache[key] = self._build(args, leaves)
        finally:
            with self._lock:
                if self._building.get(key) is building:
                    del self._building[key]
        return entry

    def _build(self, args, leaves) -> tuple:
        """(module, compiled, result tree) for these arguments: trace on the arguments' leaves
        (one IR parameter each), then the back end."""
        check_arity(self.fn, len(args), "jit")  # a new signature: maybe a wrong argument count
        if self.target == "cpu":  # the worker pool's code compiles beside the e-graph (issue 32)
            from ..codegen.runtime.native_pool import prebuild

            prebuild()
        with compile_phases() as phases:  # the compile's time by phase, for its report
            # gradients leave the algebra to the target's compile (one e-graph per function)
            with phase("trace"), traced_for(self.target) as saturated:
                module, out_tree = traced_module(
                    self.fn, args, leaves=list(args) if leaves is None else leaves
                )
            once = saturated.covers(module, module.name)  # issue 32: no second algebra pass
            compiled = compile_for(
                self.target, module, module.name, self.rules, saturated if once else None
            )
        if hasattr(getattr(compiled, "report", None), "phases"):
            compiled.report.phases = phases
        return (module, compiled, out_tree)

    def _lookup(self, args, kwargs) -> tuple:
        args = self._positional(args, kwargs)
        return self._entry(args, *_signature(args, self.fn))

    def __call__(self, *args, **kwargs):
        args = self._positional(args, kwargs)
        key, leaves = _signature(args, self.fn)
        if leaves is not None and any(isinstance(x, Tensor) for x in leaves):
            return self.fn(*args)  # jit inside a trace: just trace through
        _, compiled, tree = self._entry(args, key, leaves)
        out = compiled(*(args if leaves is None else leaves))
        if is_flat(tree):
            return out
        return tree_unflatten(tree, out if isinstance(out, tuple) else (out,))

    def lower(self, *args, **kwargs) -> Module:
        """The IR Module compiled for these arguments (cached like a call)."""
        return self._lookup(args, kwargs)[0]

    def report(self, *args, **kwargs):
        """What compiling for these arguments did (the back end's report: e-graph, costs,
        kernels, BLAS calls, timings), or None for a back end without one (interp)."""
        return getattr(self._lookup(args, kwargs)[1], "report", None)

    def __reduce__(self):
        # pickled (for a Ray worker) as its function and target, not its compiled code (native
        # code and locks do not pickle): the receiver compiles again, through the disk cache
        return (Jitted, (self.fn, self.target, self.rules, self.verify_rules))

    def cache_size(self) -> int:
        return len(self._cache)

    def clear_cache(self) -> None:
        self._cache.clear()


def jit(fn=None, *, target: str = DEFAULT_TARGET, rules=(), verify_rules: bool = False):
    """`dq.jit(f)`, `dq.jit(f, target="interp")` or `@dq.jit(target=...)`. rules: the user's
    rule files (paths), whose rulesets join the shipped ones (as `dlvm-eq opt --rules`).
    verify_rules=True: a rule verify-rules cannot prove is refused here, a VerificationError
    naming its file:line (pipeline/verified_rules.py)."""
    if fn is None:
        return lambda f: Jitted(f, target, rules, verify_rules)
    return Jitted(fn, target, rules, verify_rules)
