"""Persistent cache of compiler results that are IR functions (adjoints, optimized programs).

A second process that differentiates or optimizes the same program under the same rule files
reads the result back instead of saturating an e-graph again. The key covers the input IR text,
the options, the rule files' contents and the package version; the value is the result printed
as DLVM IR, parsed back on a hit (the printer/parser round trip is exact and tested).

    fn = cached_function("adjoint", [print_function(f), repr(options)], build)
"""
from __future__ import annotations

import hashlib
import os
from typing import Callable

from .cache import shared_cache
from .ir.module import Function, Module

_RULES_DIGEST: str | None = None


def _rules_digest() -> str:
    global _RULES_DIGEST
    if _RULES_DIGEST is None:
        from .egraph.rulefiles import rules_dir
        h = hashlib.sha256()
        for p in sorted(rules_dir().glob("*.egg")):
            h.update(p.name.encode() + b"\0" + p.read_bytes())
        _RULES_DIGEST = h.hexdigest()
    return _RULES_DIGEST


def enabled() -> bool:
    return os.environ.get("DLVM_EQ_NO_IR_CACHE", "") == ""


def function_key(kind: str, parts: list[str]) -> str:
    from . import __version__
    h = hashlib.sha256(f"{kind}\0{__version__}\0{_rules_digest()}".encode())
    for p in parts:
        h.update(b"\0" + p.encode())
    return h.hexdigest()


class _Stats:
    hits = 0
    misses = 0


stats = _Stats()


def cached_function(kind: str, parts: list[str], build: Callable[[], Function]) -> Function:
    """`build()`'s function, or the one a previous process stored under the same key."""
    if not enabled():
        return build()
    from .errors import DlvmError
    from .ir.parser import parse
    from .ir.printer import print_module

    cache = shared_cache()
    key = function_key(kind, parts)
    data = cache.get("ir-" + kind, key)
    if data is not None:
        try:
            module = parse(data.decode(), filename=f"<cached {kind}>")
            (fn,) = module.functions.values()
            stats.hits += 1
            return fn
        except (DlvmError, UnicodeDecodeError, ValueError):
            pass   # an unreadable entry is rebuilt and overwritten
    stats.misses += 1
    fn = build()
    module = Module("cached")
    module.functions[fn.name] = fn
    cache.put("ir-" + kind, key, print_module(module).encode())
    return fn
