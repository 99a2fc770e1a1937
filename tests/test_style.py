"""The code stays formatted and lint-clean (issue 35): `ruff check` and `ruff format --check`
over the package, tests, benchmarks, examples, scripts and docs, with pyproject.toml's settings;
and no Python file there is over 600 lines."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["dlvm_eq", "tests", "benchmarks", "examples", "scripts", "docs"]


def _ruff() -> str:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).exists():
        pytest.fail("ruff is not installed: the test extra installs it")
    return exe


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_is_clean(command):
    run = subprocess.run(
        [_ruff(), *command, *CHECKED], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


MAX_LINES = 600


def test_no_file_is_over_600_lines():
    over = {}
    for folder in CHECKED:
        for path in (ROOT / folder).rglob("*.py"):
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > MAX_LINES:
                over[path.relative_to(ROOT).as_posix()] = n
    assert not over, f"over {MAX_LINES} lines (split them): {over}"
