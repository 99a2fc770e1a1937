"""Codegen's subpackages import one way (kernels < llvm < cpu < gpu < runtime < planning <
execution), lazy imports included, and codegen imports neither the DSL, the e-graph, AD nor
the root package (the planner is given the fusion decision)."""
from __future__ import annotations

import ast
from pathlib import Path

CODEGEN = Path(__file__).resolve().parent.parent / "dlvm_eq" / "codegen"
LAYERS = ("kernels", "llvm", "cpu", "gpu", "runtime", "planning", "execution")
FORBIDDEN = ("dlvm_eq.dsl", "dlvm_eq.egraph", "dlvm_eq.ad")
# The compile pipeline still lives here until it moves to dlvm_eq/pipeline (issue 13); the
# package's __init__ registers its targets through it.
PIPELINE = {"backend.py"}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in the file, function-level ones included; a
    `from X import name` counts as importing X.name too (it may be a submodule)."""
    package = ["dlvm_eq"] + list(path.relative_to(CODEGEN.parent).parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return found


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["dlvm_eq", "codegen"] and parts[2] in LAYERS else None


def test_every_codegen_file_is_in_a_layer():
    loose = [p.name for p in CODEGEN.glob("*.py") if p.name not in PIPELINE | {"__init__.py"}]
    assert loose == []
    assert sorted(p.name for p in CODEGEN.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(LAYERS)


def test_layers_import_downwards_only():
    wrong = []
    for path in CODEGEN.rglob("*.py"):
        own = layer_of("dlvm_eq." + ".".join(path.relative_to(CODEGEN.parent).with_suffix("").parts))
        if own is None:
            continue
        for line, module in imported_modules(path):
            if module in ("dlvm_eq", "dlvm_eq.codegen") or module.startswith("dlvm_eq.codegen.backend"):
                wrong.append(f"{path.relative_to(CODEGEN)}:{line} imports {module} (the package root)")
            other = layer_of(module)
            if other is not None and LAYERS.index(other) > LAYERS.index(own):
                wrong.append(f"{path.relative_to(CODEGEN)}:{line} ({own}) imports {module} ({other})")
    assert wrong == []


def test_codegen_imports_no_dsl_egraph_or_ad():
    wrong = [f"{path.relative_to(CODEGEN)}:{line} imports {module}"
             for path in CODEGEN.rglob("*.py") if path.name not in PIPELINE
             for line, module in imported_modules(path)
             if module == "dlvm_eq" or module.startswith(tuple(m + "." for m in FORBIDDEN)) or module in FORBIDDEN]
    assert wrong == []


def test_no_private_name_is_imported_across_modules():
    wrong = []
    for path in CODEGEN.rglob("*.py"):
        for line, module in imported_modules(path):
            name = module.rsplit(".", 1)[-1]
            if module.startswith("dlvm_eq.codegen.") and name.startswith("_") and not name.startswith("__"):
                wrong.append(f"{path.relative_to(CODEGEN)}:{line} imports {module}")
    assert wrong == []
