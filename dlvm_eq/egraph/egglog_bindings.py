"""egglog's Rust bindings, the only part of egglog dlvm_eq uses, loaded alone whoever imports
them first (`load_bindings` in egraph/__init__.py): a plain `from egglog.bindings import ...`
runs the egglog package's __init__ first, which loads its Python DSL, black, click and graphviz
(about 0.2 s and 10 MB that no compile needs).

    from .egglog_bindings import EGraph, EggSmolError
"""

from . import load_bindings

load_bindings()

from egglog.bindings import (  # noqa: E402
    AddRuleset,
    Call,
    EggSmolError,
    EGraph,
    Int,
    Lit,
    PanicSpan,
    UnstableCombinedRuleset,
    Var,
)

__all__ = [
    "AddRuleset",
    "Call",
    "EGraph",
    "EggSmolError",
    "Int",
    "Lit",
    "PanicSpan",
    "UnstableCombinedRuleset",
    "Var",
]
