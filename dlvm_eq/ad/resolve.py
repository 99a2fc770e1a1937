"""Declared adjoints resolved for a whole module: every bodiless `[adjoint @f ...]` function
that the named functions reach (through `apply`, or by being named) gets its synthesized body.

    resolved = resolve_declared(module, ["loss_grad"])     # a Module; `module` is not changed
    resolved["loss_grad"].is_declaration                   # False (the declaration is kept)

The pipeline (dlvm_eq/pipeline) calls this once, before any stage that needs bodies (the
interpreter, the e-graph loader, the planner, the symbolic evaluator); those stages raise a
DlvmError for a declaration they are handed unresolved. Synthesis is memoized per declaration
(`synthesize_declared`), so resolving an already-resolved module returns it unchanged.
"""

from __future__ import annotations

from ..ir.control_flow import add_renamed, reachable_bodies
from ..ir.module import Function, Module
from .driver import synthesize_declared


def reachable(module: Module, roots) -> list[str]:
    """Names of the functions that running `roots` may run: the roots and what they apply."""
    seen: list[str] = []
    todo = [module[r].name for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        todo.extend(
            inst.attrs["callee"].lstrip("@") for inst in module[name].body if inst.op == "apply"
        )
    return seen


def resolve_declared(module: Module | None, roots=None) -> Module | None:
    """`module` with the declared adjoints reachable from `roots` (function names; None: all)
    synthesized; `module` itself when there are none."""
    if module is None:
        return None
    names = list(module.functions) if roots is None else reachable(module, roots)
    bodies: dict[str, Function] = {
        n: synthesize_declared(module, module[n]) for n in names if module[n].is_declaration
    }
    if not bodies:
        return module
    out = Module(module.name, module.stage)
    for name, fn in module.functions.items():
        out.add(bodies.get(name, fn))
    for fn in bodies.values():  # the loop bodies and branches of a synthesized adjoint
        for body in reachable_bodies(fn):
            if out.functions.get(body.name) is not body:
                add_renamed(out, body)
    return out


__all__ = ["reachable", "resolve_declared"]
