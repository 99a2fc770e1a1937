"""Seconds this process spent compiling, by phase (the compile-time report's totals).

    compile_seconds()   # {"trace": ..., "adjoint": ..., "rules": ..., "optimize": ..., ...}
    with compile_phases() as phases:      # what one compile spent, phase by phase
        with phase("trace"): ...
    print(phases)

Phases are exclusive: a phase inside another (the adjoint inside the trace that differentiates)
is not counted again in the outer one, and compiling rule files into this thread's egglog
session (`rules`, once per thread: egraph.optimize) is taken out of whichever phase needed it.

Shared state (threads): `_SECONDS` is read and written under `_lock` only; the stack of open
phases is per thread, the collectors per context (contextvars).
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
from contextlib import contextmanager

PHASES = ("import", "trace", "adjoint", "rules", "optimize", "plan", "kernels")
_lock = threading.Lock()
_SECONDS = dict.fromkeys(PHASES, 0.0)
_local = threading.local()
_collectors: contextvars.ContextVar[tuple[dict, ...]] = contextvars.ContextVar(
    "dlvm_eq_compile_phases", default=()
)


def add_seconds(phase: str, s: float) -> None:
    with _lock:
        _SECONDS[phase] = _SECONDS.get(phase, 0.0) + s
    for phases in _collectors.get():
        phases[phase] = phases.get(phase, 0.0) + s


def compile_seconds() -> dict[str, float]:
    """Seconds this process spent compiling, by phase: import (the code generator, loaded
    on the first native compile), trace (dq.jit's tracing), adjoint
    (differentiation in the e-graph), rules (rule files compiled into egglog sessions, once
    per thread), optimize (the e-graph), plan (fusion), kernels (LLVM code generation or
    disk-cache loads)."""
    with _lock:
        return dict(_SECONDS)


def _rule_seconds() -> float:
    # read only where the e-graph layer is loaded: a warm compile never imports egglog
    mod = sys.modules.get("dlvm_eq.egraph.optimize")
    return mod.rule_compile_seconds() if mod is not None else 0.0


@contextmanager
def phase(name: str):
    """Count the block's time as `name`, less the phases nested in it and the rule files
    compiled in it."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    frame = {"start": time.perf_counter(), "rules": _rule_seconds(), "in": 0.0, "in_rules": 0.0}
    stack.append(frame)
    try:
        yield
    finally:
        stack.pop()
        elapsed = time.perf_counter() - frame["start"]
        rules = _rule_seconds() - frame["rules"]
        own_rules = rules - frame["in_rules"]
        add_seconds(name, max(0.0, elapsed - frame["in"] - own_rules))
        if own_rules > 0:
            add_seconds("rules", own_rules)
        if stack:
            stack[-1]["in"] += elapsed
            stack[-1]["in_rules"] += rules


@contextmanager
def compile_phases():
    """Yields a dict that receives the seconds of each phase run inside the block (this thread
    or task only)."""
    phases: dict[str, float] = {}
    token = _collectors.set(_collectors.get() + (phases,))
    try:
        yield phases
    finally:
        _collectors.reset(token)
