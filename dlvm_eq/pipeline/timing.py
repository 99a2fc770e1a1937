"""Seconds this process spent compiling, by phase (the compile-time report's totals).

    compile_seconds()   # {"trace": ..., "optimize": ..., "plan": ..., "kernels": ...}

Shared state (threads): `_SECONDS` is read and written under `_lock` only; jit adds its
tracing time, the compile stages add theirs.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_SECONDS = {"trace": 0.0, "optimize": 0.0, "plan": 0.0, "kernels": 0.0}


def add_seconds(phase: str, s: float) -> None:
    with _lock:
        _SECONDS[phase] += s


def compile_seconds() -> dict[str, float]:
    """Seconds this process spent compiling, by phase: trace (dq.jit's tracing), optimize
    (the e-graph), plan (fusion), kernels (LLVM code generation or disk-cache loads)."""
    with _lock:
        return dict(_SECONDS)
