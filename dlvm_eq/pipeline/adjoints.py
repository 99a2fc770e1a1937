"""The pipeline's first stage: declared adjoints resolved, once, before any stage needs a body.

    module = resolve_adjoints(module)              # every `[adjoint @f ...]` declaration
    module = resolve_adjoints(module, ["step"])    # only what @step runs (itself, its applies)

The interpreter, the e-graph loader, the planner and the symbolic evaluator take modules whose
functions have bodies; they raise a DlvmError for a declaration (ir/declared.py). Synthesis
(dlvm_eq.ad) is memoized per declaration, so a resolved module resolves to itself.
"""

from __future__ import annotations

from ..ad.resolve import resolve_declared
from ..ir.module import Module


def resolve_adjoints(module: Module, roots=None) -> Module:
    """`module` with the declared adjoints that `roots` (function names; None: every function)
    reach synthesized: a new Module, or `module` itself when nothing was declared."""
    resolved = resolve_declared(module, roots)
    assert resolved is not None  # None only when there is no module
    return resolved


__all__ = ["resolve_adjoints"]
