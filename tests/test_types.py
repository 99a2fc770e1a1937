"""The type checker passes (issue 35): mypy over `ir`, `pipeline`, `dsl` and the public API
(`dlvm_eq/__init__.py`), with pyproject.toml's `[tool.mypy]` settings, reports no error; the
scope is not narrowed, nothing is ignored wholesale, and the check can fail."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mypy depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SCOPE = ["dlvm_eq/__init__.py", "dlvm_eq/ir", "dlvm_eq/pipeline", "dlvm_eq/dsl"]


def _mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed: the test extra installs it")
    return subprocess.run(
        [sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]


def test_mypy_reports_no_error():
    run = _mypy()  # the files and settings of [tool.mypy]
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert re.search(r"Success: no issues found in \d+ source files", run.stdout), run.stdout


def test_the_scope_is_the_issues_and_nothing_is_ignored_wholesale():
    config = _config()
    assert config["files"] == SCOPE
    for override in config.get("overrides", []):
        # only libraries without type information; never our own modules' errors
        assert set(override) <= {"module", "ignore_missing_imports"}, override
        assert not any(m.startswith("dlvm_eq") for m in override["module"]), override
    assert "ignore-without-code" in config["enable_error_code"]
    assert config["warn_unused_ignores"] is True
    ignores = []
    for path in (ROOT / "dlvm_eq").rglob("*.py"):
        text = path.read_text()
        assert "# mypy: ignore-errors" not in text, path
        assert "# type: ignore\n" not in text, f"{path}: an ignore without an error code"
        ignores += [
            f"{path}:{n}"
            for n, line in enumerate(text.splitlines(), 1)
            if "# type: ignore[" in line
        ]
    # per-line ignores are few, each with its error code and a reason on the line
    assert len(ignores) <= 5, ignores


def test_the_check_fails_on_a_type_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(x: int) -> str:\n    return x\n")
    run = _mypy(
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(tmp_path / "cache"),
        str(bad),
        cwd=tmp_path,
    )
    assert run.returncode == 1
    assert 'bad.py:2: error: Incompatible return value type (got "int", expected "str")' in (
        run.stdout
    )


def test_the_dsl_ops_declared_for_the_checker_are_the_registry_s():
    """dsl/ops.py makes dq.exp, dq.add, ... from the op registry and spells them out under
    TYPE_CHECKING; the two lists must agree (a new op in the registry is declared too)."""
    from dlvm_eq.dsl.ops import ELEMENTWISE

    tree = ast.parse((ROOT / "dlvm_eq/dsl/ops.py").read_text())
    blocks = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    declared = {
        stmt.target.id
        for block in blocks
        for stmt in block.body
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    }
    assert declared == set(ELEMENTWISE)
