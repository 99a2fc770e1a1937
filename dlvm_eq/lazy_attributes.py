"""A package's attributes imported on first access (PEP 562), so that importing the package
loads only what it needs; one helper for every package that does this.

    _LAZY = {"plan_function": "planning", "Plan": "codegen.planning.plan"}   # name -> submodule
    __getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())

Submodules are named relative to the package. The value is stored in the package's namespace
on first access, so later lookups never reach `__getattr__` again.
"""

from __future__ import annotations

import importlib


def lazy_attributes(package: str, table: dict[str, str], namespace: dict):
    """(__getattr__, __dir__) for package `package`: attribute `name` of submodule
    `table[name]`, imported on first access and kept in `namespace` (the package's globals())."""

    def __getattr__(name: str):
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
