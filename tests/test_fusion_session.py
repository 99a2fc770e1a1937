"""The fusion stage's e-graphs live in a session of their own (egraph/optimize.py's
FUSION_RULE_FILES: the schema and rules/fusion.egg, issue 32), so an egglog (push) copies no
other stage's rules: its plans are exactly those planned in the session of every rule file
(the oracle), on random programs and on the benchmark models; the session holds only the
fusion rules, and the shared session compiles none of them while planning."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from ir_programs import functions

import dlvm_eq as dq
from dlvm_eq.egraph import optimize as optimize_mod
from dlvm_eq.egraph.ruleset_schedule import Budget
from dlvm_eq.ir import Module
from dlvm_eq.pipeline.planning import plan_function

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
FUSION_KEY = (" ".join(optimize_mod.FUSION_RULE_FILES),)


def _untimed(plan) -> str:
    """A printed plan less the wall times it reports (the fusion stage's)."""
    return re.sub(r"; [0-9.]+ [mun]?s\b", "", str(plan))


def _plans(build, own: bool, pool: dict) -> str:
    """build() with the fusion stage in its own session (own) or in the shared one."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(optimize_mod, "_bases", lambda: pool)
        if not own:  # as before issue 32's split: the session of every shipped rule file
            m.setattr(optimize_mod, "FUSION_RULE_FILES", optimize_mod.STAGE_RULE_FILES)
        return build()


# pools that grow program by program, as a process's do
_OWN: dict = {}
_SHARED: dict = {}


@settings(max_examples=20, **SETTINGS)
@given(functions(n_ops=12))
def test_plans_in_the_fusion_session_are_those_of_the_shared_one(fn):
    module = Module("m")
    module.add(fn)

    def build():
        opt = dq.optimize(module).module
        return _untimed(plan_function(opt[fn.name], opt))

    own = _plans(build, True, _OWN)
    shared = _plans(build, False, _SHARED)
    assert own == shared


def test_the_fusion_session_holds_the_schema_and_fusion_rules_only(no_ir_cache):
    pool: dict = {}
    m = dq.parse(
        """module "m"
stage raw
func @f: (<4 x f32>, <4 x f32>) -> <4 x f32> {
'entry(%x: <4 x f32>, %y: <4 x f32>):
  %a = exp %x: <4 x f32>
  %b = tanh %a: <4 x f32>
  %c = multiply %b: <4 x f32>, %y: <4 x f32>
  return %c: <4 x f32>
}
"""
    )

    def build():
        opt = dq.optimize(m).module
        shared = pool[()].pruned.book
        before = set(shared.compiled)
        plan = plan_function(opt["f"], opt)
        return plan, before, set(shared.compiled)

    plan, before, after = _plans(build, True, pool)
    assert "fused" in str(plan) or "kernel" in str(plan)
    fusion = pool[FUSION_KEY]
    assert [Path(f).name for f in fusion.files] == ["schema.egg", "fusion.egg"]
    rulesets = {
        u.ruleset
        for u in fusion.pruned.book.table().units
        if u.where in fusion.pruned.book.compiled
    }
    assert rulesets == {"fusion"}
    assert after == before  # planning compiled nothing into the shared session


sys.path.insert(0, str(ROOT / "benchmarks"))
import egraph_models  # noqa: E402  (no side effects at import)

MODELS = [m for m in egraph_models.MODELS if m.__name__ in ("mlp", "lstm", "cnn", "transformer")]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_the_benchmark_models_plan_the_same(model, no_ir_cache, monkeypatch):
    monkeypatch.setattr(Budget.__init__, "__defaults__", (12, 50_000, 600.0, 10**15))  # never cut

    def build():
        _, module, fname, _ = egraph_models.build(model, algebra=True)
        optimized = dq.optimize(module, fname, target="cpu").module
        return _untimed(plan_function(optimized[fname], optimized))

    assert _plans(build, True, {}) == _plans(build, False, {})
