"""The one PEP 562 helper (dlvm_eq/lazy_attributes.py): an attribute's submodule is imported on
first access only, the value is kept in the package, unknown names are AttributeErrors, and
every lazy table of dlvm_eq names attributes that exist."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAZY_PACKAGES = ("dlvm_eq", "dlvm_eq.codegen", "dlvm_eq.pipeline")


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "lazypkg"
    root.mkdir()
    (root / "__init__.py").write_text(
        "from dlvm_eq.lazy_attributes import lazy_attributes\n"
        "_LAZY = {'heavy_value': 'sub.heavy'}\n"
        "__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())\n"
    )
    (root / "sub").mkdir()
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "heavy.py").write_text("heavy_value = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("lazypkg")
    for name in [m for m in sys.modules if m == "lazypkg" or m.startswith("lazypkg.")]:
        del sys.modules[name]


def test_the_submodule_loads_on_first_access_and_the_value_is_kept(package):
    assert "lazypkg.sub.heavy" not in sys.modules
    assert "heavy_value" in dir(package)
    assert package.heavy_value == 42
    assert "lazypkg.sub.heavy" in sys.modules
    assert vars(package)["heavy_value"] == 42  # stored: __getattr__ is not asked again


def test_an_unknown_name_is_an_attribute_error(package):
    with pytest.raises(AttributeError, match="module 'lazypkg' has no attribute 'missing'"):
        package.missing  # noqa: B018
    assert getattr(package, "missing", None) is None and not hasattr(package, "missing")


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_every_lazy_name_of_dlvm_eq_resolves(name):
    # in a fresh process: a table entry naming a moved or renamed attribute fails here
    code = (
        f"import importlib; p = importlib.import_module({name!r}); "
        "missing = [n for n in p._LAZY if getattr(p, n, None) is None]; "
        "print(missing); assert not missing"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]


def test_importing_dlvm_eq_loads_no_parser_code_generator_or_e_graph():
    code = (
        "import sys, dlvm_eq as dq; heavy = [m for m in ('lark', 'llvmlite', 'egglog', "
        "'dlvm_eq.ir.parser', 'dlvm_eq.codegen.planning.planner') if m in sys.modules]; "
        "print(heavy); assert not heavy; dq.parse; assert 'dlvm_eq.ir.parser' in sys.modules"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
