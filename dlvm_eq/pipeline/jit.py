"""`dq.jit`: trace a Python function per argument shapes/dtypes, then compile the traced
module for a target (pipeline/targets.py).

    f = dq.jit(loss)                       # traced and compiled on the first call,
    f(w, x); f(w, x)                       # then cached per argument shapes and dtypes
    f.lower(w, x)                          # the Module it compiled
    f.report(w, x)                         # what compiling did (cpu/gpu)

Shared state (threads): a Jitted's `_cache` holds only complete entries; `_building` (under
`_lock`) gives each signature one builder, so concurrent first calls compile once.
"""
from __future__ import annotations

import functools
import inspect
import threading
import time

import numpy as np

from ..dsl.api import make_ir
from ..dsl.pytree import flatten, is_flat, unflatten
from ..dsl.tensor import Tensor
from ..dsl.tracing import type_of
from ..errors import DlvmError
from ..ir.module import Module
from .targets import DEFAULT_TARGET, backend
from .timing import add_seconds


def _signature_key(args) -> tuple:
    """The cache key of a call: shapes and dtypes. numpy arrays take a fast path (a call's
    dispatch is on the hot path of a training loop); anything else goes through type_of."""
    key = []
    for a in args:
        if type(a) is np.ndarray:
            key.append((a.shape, a.dtype))
        else:
            t = type_of(a)
            key.append((t.shape, t.dtype))
    return tuple(key)


class Jitted:
    """A function compiled on first call for each distinct list of argument shapes/dtypes."""

    def __init__(self, fn, target: str = DEFAULT_TARGET):
        backend(target)    # an unknown target is a DlvmError here, not at the first call
        self.fn, self.target = fn, target
        self._cache: dict[tuple, tuple] = {}
        # one compile per signature: the first caller builds the entry (only complete entries
        # enter _cache), a concurrent caller of the same signature waits for it
        self._lock = threading.Lock()
        self._building: dict[tuple, threading.RLock] = {}
        functools.update_wrapper(self, fn, updated=())

    def _positional(self, args, kwargs):
        if not kwargs:
            return args
        bound = inspect.signature(self.fn).bind(*args, **kwargs)
        if bound.kwargs:
            raise DlvmError("jit: keyword-only arguments are not supported")
        return bound.args

    def _entry(self, args):
        key = _signature_key(args)
        entry = self._cache.get(key)
        if entry is not None:
            return entry
        with self._lock:
            building = self._building.setdefault(key, threading.RLock())
        try:
            with building:
                entry = self._cache.get(key)
                if entry is None:
                    entry = self._cache[key] = self._build(args)
        finally:
            with self._lock:
                if self._building.get(key) is building:
                    del self._building[key]
        return entry

    def _build(self, args) -> tuple:
        """(module, compiled, result tree) for these arguments: trace, then the back end."""
        tree = []

        def flat(*xs):   # the IR returns a flat tuple; remember the nesting to rebuild it
            leaves, structure = flatten(self.fn(*xs))
            tree.append(structure)
            return tuple(leaves) if len(leaves) > 1 or structure is not None else leaves[0]
        functools.update_wrapper(flat, self.fn, updated=())
        t0 = time.perf_counter()
        module = make_ir(flat)(*args)
        add_seconds("trace", time.perf_counter() - t0)
        compiled = backend(self.target)(module, module.name)
        return (module, compiled, tree[0])

    def __call__(self, *args, **kwargs):
        args = self._positional(args, kwargs)
        if any(isinstance(a, Tensor) for a in args):  # jit inside a trace: just trace through
            return self.fn(*args)
        _, compiled, tree = self._entry(args)
        out = compiled(*args)
        if is_flat(tree):
            return out
        return unflatten(tree, out if isinstance(out, tuple) else (out,))

    def lower(self, *args, **kwargs) -> Module:
        """The IR Module compiled for these arguments (cached like a call)."""
        return self._entry(self._positional(args, kwargs))[0]

    def report(self, *args, **kwargs):
        """What compiling for these arguments did (the back end's report: e-graph, costs,
        kernels, BLAS calls, timings), or None for a back end without one (interp)."""
        return getattr(self._entry(self._positional(args, kwargs))[1], "report", None)

    def cache_size(self) -> int:
        return len(self._cache)

    def clear_cache(self) -> None:
        self._cache.clear()


def jit(fn=None, *, target: str = DEFAULT_TARGET):
    """`dq.jit(f)`, `dq.jit(f, target="interp")` or `@dq.jit(target=...)`."""
    if fn is None:
        return lambda f: Jitted(f, target)
    return Jitted(fn, target)
