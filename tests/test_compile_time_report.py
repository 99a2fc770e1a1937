"""benchmarks/compile_time.py's before/after report says whether the two trees' printed plans
are the same (a compile-time change must not change the programs): it names a difference. The
warm row gives the first result, a steady step timed in the same process, and their difference
(the warm overhead), in wall time and in the main thread's and the process's CPU time."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import compile_time  # noqa: E402


def _row(seconds: float, plan: str) -> dict:
    return {
        "seconds": seconds,
        "import": 0.1,
        "rss_mb": 100.0,
        "phases": {},
        "plan": plan,
        "step": 0.01,
        "cpu": seconds / 2,
        "main": seconds / 4,
        "step_cpu": 0.008,
        "step_main": 0.005,
    }


def _results(before: Path, after: Path, after_plan: str) -> dict:
    return {
        ("mlp", str(before)): [(_row(1.0, "plan A"), _row(0.1, "plan A"))],
        ("mlp", str(after)): [(_row(0.8, after_plan), _row(0.05, after_plan))],
    }


def test_the_report_says_whether_the_plans_are_identical():
    before, after = Path("/old"), Path("/new")
    same = compile_time.report(_results(before, after, "plan A"), [], [before, after], [], False)
    assert "MLP step identical" in same
    # cold 0.8 s; warm first 0.05 s, a steady step 0.01 s, so 0.04 s of overhead; main-thread
    # CPU 12.5 ms first, 5 ms a step; process CPU 25 ms first, 8 ms a step
    row = "| MLP step | dlvm_eq after | 0.80 | 0.40 | 0.050 / 0.010 / 0.040 | 12 / 5 / 8 | 25 / 8 / 17 | 100 |"
    assert row in same
    other = compile_time.report(_results(before, after, "plan B"), [], [before, after], [], False)
    assert "MLP step DIFFERENT" in other


def test_a_peer_without_a_warm_run_leaves_the_warm_cells_empty_and_jax_warm_is_shown():
    before = Path("/old")
    results = {
        ("mlp", str(before)): [(_row(1.0, "plan A"), _row(0.1, "plan A"))],
        ("mlp", "jax"): [(_row(0.3, None), _row(0.2, None))],
        ("mlp", "torch"): [(_row(2.0, None), None)],
    }
    text = compile_time.report(results, [], [before], ["jax", "torch"], False)
    assert "| MLP step | JAX jit | 0.30 | 0.15 | 0.200 / 0.010 / 0.190 |" in text
    assert "| MLP step | torch.compile | 2.00 | 1.00 |  |  |  | 100 |" in text
