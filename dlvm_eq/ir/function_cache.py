"""Persistent cache of compiler results that are IR functions (adjoints, optimized programs).

A second process that differentiates or optimizes the same program under the same rule files
reads the result back instead of saturating an e-graph again. The key covers the input IR text,
the options, the rule files' contents (a digest the caller passes: the IR layer does not know
where rule files live; egraph.rulefiles.rules_digest) and a digest of the package's source
(`dlvm_eq.cache.source_digest`, which covers the package version too: an edited optimizer or
IR class never reads a stale entry); the
value is the Function as JSON data (`json_records`: values, types and instructions, nothing
that runs; reading needs no parser). An entry that does not read back as a Function is
rebuilt and overwritten.

    fn = cached_function("adjoint", [print_function(f), repr(options)], build, rules_digest())
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from ..cache import shared_cache, source_digest, watching_time_cuts
from ..config import settings
from ..json_records import RecordError, Schema
from .module import AdjointDecl, Const, Function, Instruction, Value
from .types import DType, TensorType, TupleType


def enabled() -> bool:
    """False when DLVM_EQ_NO_IR_CACHE is set (config)."""
    return settings().ir_cache


# Bump when what an entry holds changes (1: printed IR text; 2: a pickled Function; 3: JSON).
FORMAT = "3"
FUNCTION_SCHEMA = Schema(
    "dlvm_eq.ir.Function",
    1,
    [Function, Instruction, Value, Const, AdjointDecl, TensorType, TupleType],
    enums=[DType],
    fields={Value: ("name", "type")},
)


def function_key(kind: str, parts: list[str], rules_digest: str) -> str:
    h = hashlib.sha256(f"{kind}\0{FORMAT}\0{rules_digest}\0{source_digest()}".encode())
    for p in parts:
        h.update(b"\0" + p.encode())
    return h.hexdigest()


class _Stats:
    hits = 0
    misses = 0
    time_cut = 0  # built, but not stored: a wall-clock budget cut it short


stats = _Stats()


def cached_function(
    kind: str, parts: list[str], build: Callable[[], Function], rules_digest: str
) -> Function:
    """`build()`'s function, or the one a previous process stored under the same key
    (rules_digest: of the rule files `build` reads)."""
    if not enabled():
        return build()
    cache = shared_cache()
    key = function_key(kind, parts, rules_digest)
    data = cache.get("ir-" + kind, key)
    if data is not None:
        fn = _loads(data)
        if fn is not None:
            stats.hits += 1
            return fn
        cache.corrupt += 1  # checksum fine but not a Function: rebuilt and overwritten
    stats.misses += 1
    with watching_time_cuts() as cuts:
        fn = build()
    if cuts:  # depends on this moment's load: a later process builds its own (cache.py)
        stats.time_cut += 1
        return fn
    try:
        cache.put("ir-" + kind, key, FUNCTION_SCHEMA.dumps(fn).encode())
    except RecordError:
        pass  # a function holding something that is not data is simply not cached
    return fn


def _loads(data: bytes) -> Function | None:
    try:
        fn = FUNCTION_SCHEMA.loads(data)
    except RecordError:  # any unreadable entry is a miss
        return None
    return fn if isinstance(fn, Function) and isinstance(fn.name, str) else None
