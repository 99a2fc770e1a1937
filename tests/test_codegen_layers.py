"""Codegen is all in its layered subpackages (kernels < llvm < cpu < gpu < runtime < planning <
execution; that they import one way, lazy imports included, is the import-linter contract that
tests/test_layers.py checks), and no private name is imported across its modules."""

from __future__ import annotations

import ast
from pathlib import Path

CODEGEN = Path(__file__).resolve().parent.parent / "dlvm_eq" / "codegen"
LAYERS = ("kernels", "llvm", "cpu", "gpu", "runtime", "planning", "execution")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in the file, function-level ones included; a
    `from X import name` counts as importing X.name too (it may be a submodule)."""
    package = ["dlvm_eq"] + list(path.relative_to(CODEGEN.parent).parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return found


def test_every_codegen_file_is_in_a_layer():
    loose = [p.name for p in CODEGEN.glob("*.py") if p.name != "__init__.py"]
    assert loose == []
    assert sorted(
        p.name for p in CODEGEN.iterdir() if p.is_dir() and p.name != "__pycache__"
    ) == sorted(LAYERS)


def test_no_private_name_is_imported_across_modules():
    wrong = []
    for path in CODEGEN.rglob("*.py"):
        for line, module in imported_modules(path):
            name = module.rsplit(".", 1)[-1]
            if (
                module.startswith("dlvm_eq.codegen.")
                and name.startswith("_")
                and not name.startswith("__")
            ):
                wrong.append(f"{path.relative_to(CODEGEN)}:{line} imports {module}")
    assert wrong == []
