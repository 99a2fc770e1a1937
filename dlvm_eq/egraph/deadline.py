"""A budget's two sides. Work (what decides the program): saturation steps, matches and e-nodes
counted in work units, and the work that extracting an e-graph of n e-nodes will take, so that
saturation stops while the work budget can still extract what it leaves; counted, never timed,
so that one program compiles to one plan however busy the machine is. The wall clock (only a
safety net far above what the work takes): one deadline for a whole call (saturation,
serialization, extraction); a call it cuts says so (cache.note_time_cut) and is not cached.

    d = Deadline(2.0)                 # two seconds from now
    d.left()                          # seconds left (never negative)
    part = d.split(3)                 # a third of what is left, for the first of 3 functions
    extraction_seconds(20_000)        # about what serialize + greedy extract of 20k e-nodes take
    extraction_work(20_000)           # the same in work units: 2,420,000
    step_work(nodes=8_000, iterations=1, matches=9_886, new_nodes=8_259)  # one saturation step
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

# Work units: about a microsecond each on this project's quiet 2-core machines (fitted to 7,000
# saturation steps and 64 extractions of the benchmark models, session 18). Only their ratios
# matter to a plan: the budgets (ruleset_schedule.Budget.work) are counted in the same units.
STEP_WORK = 1_000  # an egglog call: the step, the analysis after it, the e-node count
MATCH_WORK = 3  # a match found (applied or held back)
NODE_ITERATION_WORK = 0.4  # an e-node searched by one iteration
NEW_NODE_WORK = 5  # an e-node added (and rebuilt)
EXTRACT_FIXED_WORK = 20_000  # an extraction, whatever its size (JSON, cost model, unload)
EXTRACT_NODE_WORK = 120  # serialize + class types + greedy + local search + unload, per e-node


def step_work(nodes: int, iterations: int, matches: int, new_nodes: int) -> int:
    """The work of one saturation step: `iterations` iterations over an e-graph of `nodes`
    e-nodes that found `matches` matches and added `new_nodes` e-nodes."""
    return int(
        STEP_WORK
        + MATCH_WORK * matches
        + NODE_ITERATION_WORK * nodes * iterations
        + NEW_NODE_WORK * max(new_nodes, 0)
    )


def extraction_work(nodes: int) -> int:
    """The work of serializing, extracting and unloading an e-graph of `nodes` e-nodes."""
    return EXTRACT_FIXED_WORK + EXTRACT_NODE_WORK * max(nodes, 0)


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
