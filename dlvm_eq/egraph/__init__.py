"""The e-graph: loading IR into egglog, saturating rule files, serializing, unloading.

Owns: programs as egglog terms (lets.py: interned Lets; loader.py: IR -> Lets; values.py: Lets
-> marker rows), sessions, the one budgeted saturation driver (saturate.py, deadline.py,
ruleset_schedule.py), optimize and query, the fusion decision, unloading back to IR. May
import extract, ir and the base modules (errors, cache, json_records); never ad or above
(declared adjoints are resolved before a program reaches the e-graph).

`EGraphSession` and `RuleFileError` load on first use (PEP 562): they import egglog, which a
warm-cache compile (no e-graph built) never needs. `load_bindings()` loads egglog's Rust
bindings alone (see there); entry points that are about to build an e-graph call it first."""

import threading

from .loader import LoadedProgram, load_function
from .serialized import Graph, class_types
from .unload import unload

__all__ = [
    "EGraphSession",
    "Graph",
    "LoadedProgram",
    "RuleFileError",
    "class_types",
    "load_bindings",
    "load_function",
    "unload",
]


def __getattr__(name):
    if name in ("EGraphSession", "RuleFileError"):
        load_bindings()
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_bindings() -> None:
    """Load `egglog.bindings` (the Rust extension module, ~10 ms) without running the egglog
    package's __init__, which loads egglog's Python DSL and, through its pretty-printer, black:
    ~0.2 s that dlvm_eq never uses (it drives egglog through the bindings only).

    The module is registered under its own name, so `from egglog.bindings import ...` finds
    it, and a later `import egglog` (by a user) reuses it instead of initializing the extension
    twice, and gets its `bindings` attribute (`_EgglogFinder`). Anything unexpected falls back to
    the ordinary import."""
    import sys

    if "egglog.bindings" in sys.modules and not _loading:
        return
    with _load_lock:  # threads compiling at once: one loads, the others wait for it
        if "egglog.bindings" in sys.modules:
            return
        _loading.append(True)
        try:
            _load()
        finally:
            _loading.clear()


_load_lock = threading.Lock()
_loading: list = []  # non-empty while a thread is loading (the module is registered first)


def _load() -> None:
    import sys

    try:
        import importlib.machinery
        import importlib.util

        package = importlib.util.find_spec("egglog")  # finds it; runs nothing
        spec = importlib.machinery.PathFinder.find_spec(
            "egglog.bindings", list(package.submodule_search_locations or ())
        )
        if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            raise ImportError("egglog.bindings is not an extension module here")
        module = importlib.util.module_from_spec(spec)
        sys.modules["egglog.bindings"] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules["egglog.bindings"]
            raise
        sys.meta_path.insert(0, _EgglogFinder)
    except Exception:
        import egglog.bindings  # noqa: F401


class _EgglogFinder:
    """Meta path finder, used once: the first `import egglog` after `load_bindings` gets the
    package's ordinary spec with a loader that sets `egglog.bindings` before running the
    package's __init__ (the import system sets a submodule attribute only when it loads the
    submodule itself)."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "egglog":
            return None
        import importlib.machinery
        import sys

        if cls in sys.meta_path:
            sys.meta_path.remove(cls)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _WithBindings(spec.loader)
        return spec


class _WithBindings:
    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):  # resource readers and the rest: the real loader's
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        import sys

        bindings = sys.modules.get("egglog.bindings")
        if bindings is not None:
            module.bindings = bindings
        self._loader.exec_module(module)
