"""Kernel symbols: a kernel's name is a hash of its own LLVM IR, so that equal kernels
coincide (one cache entry, one loaded function) and different ones do not collide. The CPU
and NVPTX builders all name their kernels here.

    text, symbol = symbol_for(lambda name: str(build_module(spec, name)), prefix="dq_")
    # the module is built once under a placeholder name; the hash of that text replaces it
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

PLACEHOLDER = "__dq_kernel__"  # replaced by the IR's hash


def symbol_for(
    build: Callable[[str], str], prefix: str = "dq_", placeholder: str = PLACEHOLDER
) -> tuple[str, str]:
    """(IR text, symbol) for `build(symbol) -> IR text`: the symbol is `prefix` and a hash of
    the text built under `placeholder` (a kernel family keeps its own placeholder and prefix,
    so that its symbols, and the cache entries keyed by them, stay what they were)."""
    draft = build(placeholder)
    symbol = prefix + hashlib.sha256(draft.encode()).hexdigest()[:20]
    return draft.replace(f'@"{placeholder}"', f'@"{symbol}"'), symbol
