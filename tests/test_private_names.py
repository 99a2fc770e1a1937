"""No private name crosses modules inside dlvm_eq (issue 35): a `_name` is its module's own,
so neither `from .x import _name` nor `x._name` on an imported module or object appears in
another module. A helper two modules share gets a public name and a docstring."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dlvm_eq"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def crossings(source: str) -> list[str]:
    """`from M import _x` and `m._x` (m bound by an import of dlvm_eq) in one module's source."""
    tree = ast.parse(source)
    imported, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.level > 0 or (node.module or "").startswith("dlvm_eq")
        ):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"line {node.lineno}: imports {alias.name}")
                imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            imported |= {
                (a.asname or a.name).split(".")[0]
                for a in node.names
                if a.name.startswith("dlvm_eq")
            }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
            and _private(node.attr)
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_the_check_finds_both_forms():
    source = "from .primitive import _own_value\nfrom . import window_ops\nwindow_ops._spread(1)\n"
    assert crossings(source) == ["line 1: imports _own_value", "line 3: window_ops._spread"]
    assert crossings("import numpy as np\nnp._x\nfrom .m import __all__\n") == []


def test_no_private_name_crosses_modules():
    found = [
        f"{path.relative_to(PACKAGE.parent)} {hit}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for hit in crossings(path.read_text())
    ]
    assert found == []
