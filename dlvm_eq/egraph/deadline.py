"""The wall-clock side of a budget: one deadline for a whole call (saturation, serialization,
extraction), and the estimate of what serializing and extracting an e-graph of n e-nodes costs,
so that saturation stops while there is still time to extract.

    d = Deadline(2.0)                 # two seconds from now
    d.left()                          # seconds left (never negative)
    part = d.split(3)                 # a third of what is left, for the first of 3 functions
    extraction_seconds(20_000)        # about what serialize + greedy extract of 20k e-nodes take
"""

from __future__ import annotations

import threading
import time

# serialize + json + class types + greedy extraction + unload, per e-node (measured on this
# project's 2-core machines: 40-80 us); adjusted by what this process measures (`observe`)
_DEFAULT_SECONDS_PER_NODE = 60e-6
_FIXED_SECONDS = 0.02  # per extraction, whatever its size (JSON, cost model, unload)
_rate = _DEFAULT_SECONDS_PER_NODE
_lock = threading.Lock()


_excused = threading.local()


def excuse(seconds: float) -> None:
    """Seconds this thread spent on what no budget bounds: compiling rules into a session as a
    program needs them (egraph/scratch_rules.py). A deadline running meanwhile moves by as
    much: counted, a cold process would saturate less than a warm one, and compile another
    program (tests/test_budget_cold_session.py)."""
    _excused.seconds = excused() + seconds


def excused() -> float:
    """Seconds `excuse`d on this thread so far."""
    return getattr(_excused, "seconds", 0.0)


class Deadline:
    """A point in time (time.perf_counter() seconds) by which a call must be done; what this
    thread spends on excused work (`excuse`) meanwhile moves it later."""

    def __init__(self, seconds: float, start: float | None = None):
        self.start = time.perf_counter() if start is None else start
        self.seconds = float(seconds)
        self.at = self.start + self.seconds
        self._excused = excused()

    def _now(self) -> float:
        return time.perf_counter() - (excused() - self._excused)

    def left(self) -> float:
        return max(0.0, self.at - self._now())

    def elapsed(self) -> float:
        return self._now() - self.start

    @property
    def expired(self) -> bool:
        return self._now() >= self.at

    def split(self, parts: int) -> Deadline:
        """A deadline 1/parts of the time left from now: the first of `parts` equal shares
        (call it again for the next part: what the first left unused is shared again)."""
        now = time.perf_counter()
        return Deadline(self.left() / max(parts, 1), start=now)

    def __repr__(self) -> str:
        return f"Deadline({self.seconds:g} s, {self.left():.3f} s left)"


def extraction_seconds(nodes: int) -> float:
    """Estimated seconds to serialize, extract (greedy) and unload an e-graph of `nodes` e-nodes."""
    return _FIXED_SECONDS + _rate * max(nodes, 0)


def nodes_within(seconds: float) -> int:
    """The largest e-graph (e-nodes) whose extraction fits in `seconds`."""
    return max(0, int((seconds - _FIXED_SECONDS) / _rate))


def observe(nodes: int, seconds: float) -> None:
    """Learn the per-node rate from a measured extraction (only large ones say anything)."""
    global _rate
    if nodes < 2_000 or seconds <= 0:
        return
    measured = seconds / nodes
    with _lock:
        # move halfway, never below a quarter nor above four times the default: one odd
        # measurement (a busy machine) must not make the next call overrun or stop too early
        _rate = min(
            4 * _DEFAULT_SECONDS_PER_NODE,
            max(_DEFAULT_SECONDS_PER_NODE / 4, (_rate + measured) / 2),
        )
