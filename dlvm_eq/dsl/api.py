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
from .pytree import is_flat, tree_flatten, tree_unflatten
from .tensor import Tensor
from .tracing import function_name, trace
from .tree_args import flatten_args, flat_function, leaf_names, leaf_types

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
    args are numpy arrays, Python or numpy scalars, `dq.spec(shape, dtype)`, or pytrees of
    them (dicts, lists, tuples, namedtuples: one IR parameter per leaf)."""
    def build(*example_args) -> Module:
        return _traced_module(fn, example_args, name)[0]
    functools.update_wrapper(build, fn, updated=())
    return build


def _traced_module(fn, args, name=None, leaves=None) -> tuple[Module, object]:
    """(verified Module of one function, the result's tree structure): `fn` traced on the
    leaves of its pytree arguments."""
    if leaves is None:
        leaves, in_tree = flatten_args(args, fn, "make_ir")
    else:
        in_tree = tree_flatten(tuple(args))[1]
    flat, out_trees = flat_function(fn, in_tree)
    function = trace(flat, leaves, name=name or function_name(fn),
                     names=leaf_names(fn, in_tree))
    code = getattr(fn, "__code__", None)
    if code is not None:   # the user's def, not the flattening wrapper
        function.location = (code.co_filename, code.co_firstlineno, 1)
    module = Module(function.name)
    module.add(function)
    verify(module)
    return module, out_trees[0]


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
        t0 = time.perf_counter()
        module, out_tree = _traced_module(self.fn, args, leaves=list(args) if leaves is None
                                          else leaves)
        with _TRACE_LOCK:
            TRACE_SECONDS["trace"] += time.perf_counter() - t0
        compiled = _BACKENDS[self.target](module, module.name)
        return (module, compiled, out_tree)

    def _lookup(self, args, kwargs) -> tuple:
        args = self._positional(args, kwargs)
        return self._entry(args, *_signature(args, self.fn))

    def __call__(self, *args, **kwargs):
        args = self._positional(args, kwargs)
        key, leaves = _signature(args, self.fn)
        if leaves is not None and any(isinstance(x, Tensor) for x in leaves):
            return self.fn(*args)   # jit inside a trace: just trace through
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
