"""The pipeline (dlvm_eq/pipeline): declared adjoints resolved once and only there, the
target table, `lower` (what `dq.compile` and `dlvm-eq codegen` plan), and the one-way layers
it makes possible (checked on the source, lazy imports included)."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq import pipeline
from dlvm_eq.cli import main
from dlvm_eq.errors import DlvmError
from dlvm_eq.ir import interpret as interpret_resolved
from dlvm_eq.pipeline import planning

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "dlvm_eq"

# g applies the declared adjoint of f; h is declared but nothing g runs reaches it
SOURCE = """
module "m"
stage raw

func @f: (<3 x f64>, <3 x f64>) -> f64 {
'entry(%x: <3 x f64>, %y: <3 x f64>):
    %p = multiply %x: <3 x f64>, %y: <3 x f64>
    %q = multiply %p: <3 x f64>, %x: <3 x f64>
    %s = reduce %q: <3 x f64> by add init 0: f64 along 0
    return %s: f64
}

[adjoint @f wrt 0]
func @f_grad: (<3 x f64>, <3 x f64>) -> <3 x f64>

[adjoint @f wrt 1]
func @h: (<3 x f64>, <3 x f64>) -> <3 x f64>

func @g: (<3 x f64>, <3 x f64>) -> <3 x f64> {
'entry(%x: <3 x f64>, %y: <3 x f64>):
    %d = apply @f_grad(%x: <3 x f64>, %y: <3 x f64>): (<3 x f64>, <3 x f64>) -> <3 x f64>
    %e = multiply %d: <3 x f64>, %d: <3 x f64>
    return %e: <3 x f64>
}
"""
X = np.array([1.0, -2.0, 0.5])
Y = np.array([0.25, 3.0, -1.5])


def test_resolve_adjoints_fills_in_only_what_the_roots_reach():
    m = dq.parse(SOURCE)
    r = pipeline.resolve_adjoints(m, ["g"])
    assert not r["f_grad"].is_declaration and r["h"].is_declaration
    assert m["f_grad"].is_declaration                   # the module given is not changed
    everything = pipeline.resolve_adjoints(m)
    assert not everything["h"].is_declaration
    assert pipeline.resolve_adjoints(everything) is everything    # nothing left to resolve


def test_stages_below_the_pipeline_refuse_a_declaration_and_say_what_to_do():
    m = dq.parse(SOURCE)
    with pytest.raises(DlvmError, match=r"@f_grad is a declared adjoint .*resolve_adjoints"):
        interpret_resolved(m, "g", X, Y)


def test_public_entry_points_resolve_first():
    m = dq.parse(SOURCE)
    dx = 2 * X * Y                                      # d/dx sum(x*y*x)
    np.testing.assert_allclose(dq.interpret(m, "g", X, Y), dx * dx, rtol=1e-12)
    np.testing.assert_allclose(dq.interpret(m, "h", X, Y), X * X, rtol=1e-12)
    np.testing.assert_allclose(dq.compile(m, "g")(X, Y), dx * dx, rtol=1e-9)


def test_lower_plans_without_touching_the_module_and_reuses_the_plan_cache():
    m = dq.parse(SOURCE)
    first = pipeline.lower(m, "g", "cpu")
    hits = planning.plan_cache_stats["hits"]
    again = pipeline.lower(dq.parse(SOURCE), "g", "cpu")
    assert planning.plan_cache_stats["hits"] == hits + 1
    assert m["f_grad"].is_declaration and str(again.plan) == str(first.plan)


def test_codegen_command_goes_through_the_plan_cache(tmp_path, capsys):
    src = tmp_path / "m.dl"
    src.write_text(SOURCE)
    assert main(["codegen", str(src), "-f", "g", "--emit", "llvm"]) == 0
    hits = planning.plan_cache_stats["hits"]
    assert main(["codegen", str(src), "-f", "g", "--emit", "llvm"]) == 0
    assert planning.plan_cache_stats["hits"] == hits + 1
    assert "define" in capsys.readouterr().out


def test_jit_targets_come_from_the_pipelines_table():
    with pytest.raises(DlvmError, match=r"unknown target 'tpu' \(available: .*cpu.*interp"):
        dq.jit(lambda x: x, target="tpu")
    seen = []

    def compile_doubled(module, name):
        seen.append(name)
        return lambda *a: dq.interpret(module, name, *a) * 2
    pipeline.register_backend("doubled", compile_doubled)
    out = dq.jit(lambda x: dq.exp(x), target="doubled")(X)
    np.testing.assert_allclose(out, 2 * np.exp(X))
    assert len(seen) == 1


# ---------------------------------------------------------------- the layers, on the source

def _imports(path: Path) -> set[str]:
    """Absolute names of the dlvm_eq modules a file imports, at any depth (lazy too)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("dlvm_eq")}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            if node.level == 0 and not mod.startswith("dlvm_eq"):
                continue
            out |= {f"{mod}.{a.name}" if not node.module else mod for a in node.names}
    return out


def _layer_imports(layer: str) -> set[str]:
    root = PACKAGE / layer
    files = [root.with_suffix(".py")] if root.with_suffix(".py").is_file() else root.rglob("*.py")
    return {name for p in files for name in _imports(p)}


@pytest.mark.parametrize("layer,forbidden", [
    ("codegen", ("dsl", "egraph", "ad", "pipeline", "verify", "cli")),
    ("ir", ("ad", "egraph", "dsl", "codegen", "pipeline")),
    ("egraph", ("ad", "pipeline", "verify", "cli")),
    ("dsl", ("codegen", "egraph", "ad", "pipeline")),
    ("verify", ("pipeline", "cli")),
    ("ad", ("pipeline", "dsl", "codegen", "verify")),
    ("pipeline", ("cli", "models")),
    ("ir_cache", ("egraph", "ad", "pipeline")),
    ("config", ("ir", "egraph", "codegen", "pipeline")),
])
def test_lower_layers_do_not_import_higher_ones(layer, forbidden):
    bad = sorted(n for n in _layer_imports(layer)
                 if any(n == f"dlvm_eq.{f}" or n.startswith(f"dlvm_eq.{f}.") for f in forbidden))
    assert bad == []


@pytest.mark.parametrize("layer", ["ir", "egraph", "extract", "codegen", "dsl", "ad", "verify",
                                   "pipeline", "models", "ir_cache", "cache"])
def test_no_layer_imports_the_root_package(layer):
    names = _layer_imports(layer)
    subpackages = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    root_names = sorted(n for n in names if n == "dlvm_eq"
                        or (n.count(".") == 1 and n.split(".")[1] not in subpackages))
    assert root_names == []
