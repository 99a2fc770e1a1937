"""The one message for a declared adjoint that reached a stage unresolved.

Bodies of `[adjoint @f ...]` declarations are synthesized by the differentiator, which sits
above the IR; the pipeline (`dlvm_eq.pipeline.resolve_adjoints`, and every public entry point:
`dq.interpret`, `dq.optimize`, `dq.compile`, `dq.jit`) fills them in before any stage runs.
A library caller that hands a stage a declaration gets this error instead of a body.
"""

from __future__ import annotations

from ..errors import IRError
from .module import Function


def require_body(fn: Function) -> None:
    """Raise an IRError unless `fn` has a body."""
    if not fn.is_declaration:
        return
    if fn.adjoint is None:
        raise IRError(f"@{fn.name} has no body")
    raise IRError(
        f"@{fn.name} is a declared adjoint whose body is not synthesized: run it through "
        "dq.interpret / dq.optimize / dq.compile, or call "
        "dlvm_eq.pipeline.resolve_adjoints(module) first"
    )
