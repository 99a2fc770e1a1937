"""A newcomer's path (issue 35): every tutorial script under docs/tutorials/ runs as a reader
runs it (`python docs/tutorials/NAME.py` from the repository root, a fresh process and an empty
compile cache) and passes its asserts, which are the claims its page makes. The page includes
the script (docs/tutorials/*.md, `--8<--`), so page and test cannot drift apart."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
SCRIPTS = sorted(p.name for p in TUTORIALS.glob("*.py"))


def run_script(name: str, tmp_path) -> str:
    env = dict(os.environ, PYTHONIOENCODING="utf-8", DLVM_EQ_CACHE_DIR=str(tmp_path / "cache"))
    # this checkout's package, whatever `pip install -e` points at (a worktree's tests)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    proc = subprocess.run(
        [sys.executable, str(TUTORIALS / name)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


# under pytest-xdist (`make test`) the scripts that start Ray run in the worker that runs
# test_distributed.py, one local Ray instance at a time
@pytest.mark.parametrize(
    "name",
    [pytest.param(s, marks=pytest.mark.xdist_group("ray")) if "ray" in s else s for s in SCRIPTS],
)
def test_tutorial_script_runs_and_its_claims_hold(name, tmp_path):
    if name == "train_on_ray.py" and importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install -e '.[distributed]'")
    out = run_script(name, tmp_path)
    assert out.strip(), f"{name} printed nothing"


def test_every_tutorial_page_includes_a_script_that_exists():
    pages = sorted(TUTORIALS.glob("*.md"))
    assert len(pages) >= 5
    included = set()
    for page in pages:
        names = re.findall(r'--8<-- "docs/tutorials/([\w.]+?\.py)"', page.read_text())
        assert names, f"{page.name} includes no script"
        included.update(names)
    assert set(SCRIPTS) - included == {"ten_lines.py"}  # getting-started.md includes that one
    assert "docs/tutorials/ten_lines.py:model" in (ROOT / "docs/getting-started.md").read_text()
