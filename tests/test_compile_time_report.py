"""benchmarks/compile_time.py's before/after report says whether the two trees' printed plans
are the same (a compile-time change must not change the programs): it names a difference. The
warm column less a step is the warm compile less a second call's time."""

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
        "main_cpu": seconds / 4,
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
    assert "| MLP step | dlvm_eq after | 0.80 | 0.050 | 0.040 | 0.40 / 0.025 | 0.20 | 100 |" in same
    other = compile_time.report(_results(before, after, "plan B"), [], [before, after], [], False)
    assert "MLP step DIFFERENT" in other
