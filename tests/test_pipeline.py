"""The pipeline (dlvm_eq/pipeline): declared adjoints resolved once and only there, the
target table and `lower` (what `dq.compile` and `dlvm-eq codegen` plan). The one-way layers
it makes possible are checked by tests/test_layers.py (import-linter)."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq import pipeline
from dlvm_eq.cli import main
from dlvm_eq.errors import DlvmError
from dlvm_eq.ir import interpret as interpret_resolved
from dlvm_eq.pipeline import planning

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
    assert m["f_grad"].is_declaration  # the module given is not changed
    everything = pipeline.resolve_adjoints(m)
    assert not everything["h"].is_declaration
    assert pipeline.resolve_adjoints(everything) is everything  # nothing left to resolve


def test_stages_below_the_pipeline_refuse_a_declaration_and_say_what_to_do():
    m = dq.parse(SOURCE)
    with pytest.raises(DlvmError, match=r"@f_grad is a declared adjoint .*resolve_adjoints"):
        interpret_resolved(m, "g", X, Y)


def test_public_entry_points_resolve_first():
    m = dq.parse(SOURCE)
    dx = 2 * X * Y  # d/dx sum(x*y*x)
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
