"""Persistent cache of compiler results that are IR functions (adjoints, optimized programs).

A second process that differentiates or optimizes the same program under the same rule files
reads the result back instead of saturating an e-graph again. The key covers the input IR text,
the options, the rule files' contents, the package version and a digest of the package's source
(`dlvm_eq.cache.source_digest`: an edited optimizer or IR class never reads a stale entry); the
value is the Function pickled (unpickling is ~50x faster than parsing the printed IR, and needs
no parser). An entry that does not unpickle to a Function is rebuilt and overwritten.

    fn = cached_function("adjoint", [print_function(f), repr(options)], build)
"""
from __future__ import annotations

import hashlib
import os
import pickle
from typing import Callable

from .cache import shared_cache, source_digest
from .ir.module import Function

_RULES_DIGEST: str | None = None


def rules_digest() -> str:
    """sha256 of the shipped rule files (names and contents), once per process."""
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


# Bump when what an entry holds changes (1: printed IR text; 2: a pickled Function).
FORMAT = "2"


def function_key(kind: str, parts: list[str]) -> str:
    from . import __version__
    h = hashlib.sha256(f"{kind}\0{FORMAT}\0{__version__}\0{rules_digest()}\0{source_digest()}".encode())
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
    cache = shared_cache()
    key = function_key(kind, parts)
    data = cache.get("ir-" + kind, key)
    if data is not None:
        fn = _loads(data)
        if fn is not None:
            stats.hits += 1
            return fn
        cache.corrupt += 1      # checksum fine but not a Function: rebuilt and overwritten
    stats.misses += 1
    fn = build()
    cache.put("ir-" + kind, key, pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL))
    return fn


def _loads(data: bytes) -> Function | None:
    try:
        fn = pickle.loads(data)
    except Exception:   # noqa: BLE001 - any unreadable entry is a miss
        return None
    return fn if isinstance(fn, Function) and isinstance(fn.name, str) else None
