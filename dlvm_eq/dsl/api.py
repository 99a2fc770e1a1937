"""The user's entry points: `make_ir` (like `jax.make_jaxpr`) and `jit`.

    print(dq.make_ir(loss)(w, x))          # module "loss" ... func @loss: (...) -> f32 { ... }
    f = dq.jit(loss)                       # traced and compiled on the first call,
    f(w, x); f(w, x)                       # then cached per argument shapes and dtypes
    f.lower(w, x)                          # the Module it compiled

Back ends plug in through `register_backend(target, compile)`, where
`compile(module, name) -> callable(*numpy arrays)`; this layer registers only "interp";
`dlvm_eq.codegen` registers "cpu" (the default) and "gpu" when imported.
"""
from __future__ import annotations

import functools
import inspect
import threading
import time

import numpy as np

from ..errors import DlvmError
from ..ir.interp import interpret
from ..ir.module import Module
from ..ir.verifier import verify
from .pytree import flatten, is_flat, unflatten
from .tensor import Tensor
from .tracing import function_name, trace, type_of

DEFAULT_TARGET = "cpu"   # the llvmlite code generator (dlvm_eq.codegen); "interp" runs the reference interpreter

_BACKENDS: dict = {}
TRACE_SECONDS = {"trace": 0.0}   # seconds spent tracing in this process (compile-time report)
_TRACE_LOCK = threading.Lock()


def register_backend(target: str, compile) -> None:
    """`compile(module, name)` returns a callable taking and returning numpy arrays."""
    _BACKENDS[target] = compile


def _compile_interp(module: Module, name: str):
    def run(*arrays):
        out = interpret(module, name, *arrays)
        # a returned parameter would alias the caller's array; jit outputs are fresh arrays
        if isinstance(out, tuple):
            return tuple(o.copy() if any(o is a for a in arrays) else o for o in out)
        return out.copy() if any(out is a for a in arrays) else out
    return run


register_backend("interp", _compile_interp)


def _load_code_generators() -> None:
    """The code generator registers "cpu"/"gpu" when imported; it sits to the right of this
    layer, so it is imported only on demand, by name."""
    import importlib
    try:
        importlib.import_module("dlvm_eq.codegen")
    except ImportError:
        pass


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
        if target not in _BACKENDS:
            _load_code_generators()
        if target not in _BACKENDS:
            known = ", ".join(sorted(_BACKENDS))
            raise DlvmError(f"jit: unknown target {target!r} (available: {known})")
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
        with _TRACE_LOCK:
            TRACE_SECONDS["trace"] += time.perf_counter() - t0
        compiled = _BACKENDS[self.target](module, module.name)
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

    def __reduce__(self):
        # pickled (for a Ray worker) as its function and target, not its compiled code (native
        # code and locks do not pickle): the receiver compiles again, through the disk cache
        return (Jitted, (self.fn, self.target))

    def cache_size(self) -> int:
        return len(self._cache)

    def clear_cache(self) -> None:
        self._cache.clear()


def jit(fn=None, *, target: str = DEFAULT_TARGET):
    """`dq.jit(f)`, `dq.jit(f, target="interp")` or `@dq.jit(target=...)`."""
    if fn is None:
        return lambda f: Jitted(f, target)
    return Jitted(fn, target)
