"""Saturation always stops and says why; rule-file mistakes are the project's own errors."""

from __future__ import annotations

import time

import pytest

import dlvm_eq as dq
from dlvm_eq.egraph import EGraphSession, RuleFileError
from dlvm_eq.egraph.optimize import new_session
from dlvm_eq.egraph.ruleset_schedule import Budget, Schedule
from dlvm_eq.egraph.saturate import node_count, saturate
from dlvm_eq.errors import DlvmError
from dlvm_eq.ir import F32, FunctionBuilder, Module, tensor

# associativity and commutativity of + with nothing to stop them: the e-graph of a sum of n
# terms grows towards 3^n classes
EXPLODING = """
(ruleset explode)
(rewrite (Add a b) (Add b a) :ruleset explode)
(rewrite (Add (Add a b) c) (Add a (Add b c)) :ruleset explode)
(rewrite (Add a (Add b c)) (Add (Add a b) c) :ruleset explode)
"""


def long_sum(n: int = 14) -> Module:
    b = FunctionBuilder("f", [tensor(3, F32)] * n, [f"x{i}" for i in range(n)])
    v = b.params[0]
    for p in b.params[1:]:
        v = b.emit("add", [v, p])
    m = Module("m")
    m.add(b.finish(v))
    return m


def exploding_session() -> EGraphSession:
    s = EGraphSession()
    s.add_rules_text(EXPLODING, "explode.egg")
    m = long_sum()
    s.add_function(m["f"], m)
    return s


def test_node_budget_stops_an_exploding_ruleset():
    s = exploding_session()
    rep = saturate(s, Schedule(("explode",)), Budget(iterations=1000, nodes=3000, seconds=60))
    assert rep.stop_reason == "nodes"
    # stopped past the budget, or before a step that would have ended twice past it
    assert node_count(s) == rep.nodes > 3000 / 4
    assert rep.rule_matches and "e-node budget (3000) reached" in str(rep)


def test_time_budget_stops_an_exploding_ruleset():
    s = exploding_session()
    t0 = time.perf_counter()
    # the work budget (counted, the default since session 18) out of the way: the clock's net
    budget = Budget(iterations=1000, nodes=10**9, seconds=0.3, work=10**15)
    rep = saturate(s, Schedule(("explode",)), budget)
    assert rep.stop_reason == "seconds" and rep.iterations < 1000
    # an iteration is never interrupted, and a loaded machine runs it slowly: a hang guard only
    assert time.perf_counter() - t0 < 60.0
    assert "time budget (0.3 s) reached" in str(rep)


def test_iteration_budget():
    s = exploding_session()
    rep = saturate(s, Schedule(("explode",)), Budget(iterations=2, nodes=10**9, seconds=60))
    assert rep.stop_reason == "iterations" and rep.iterations == 2


def test_saturation_is_reported():
    s = new_session()
    m = long_sum(3)
    s.add_function(m["f"], m)
    rep = saturate(s)
    assert rep.stop_reason == "saturated" and rep.saturated


def test_optimize_with_an_exploding_user_rule_file_stops_and_stays_correct(tmp_path):
    # the rules grow the e-graph without bound and the time budget is never reached (however
    # loaded the machine): the e-node budget must be what stops them
    path = tmp_path / "explode.egg"
    path.write_text(EXPLODING)
    r = dq.optimize(
        long_sum(),
        rules=[path],
        budget={"seconds": 600.0, "nodes": 20_000, "iterations": 1000, "work": 10**12},
    )
    fr = r.report["f"]
    assert fr.saturation.stop_reason == "nodes"
    # stopped at the budget, or before a step whose matches would overrun it
    assert fr.saturation.nodes <= 20_000 and fr.saturation.iterations < 1000
    assert any("Add" in name for name in fr.saturation.rule_matches)  # the user's rules ran
    assert len(r.module["f"].body) == 13


def test_broken_user_rule_file_names_file_and_line(tmp_path):
    path = tmp_path / "broken.egg"
    path.write_text("(ruleset mine)\n\n(rewrite (Add a b) (Frobnicate b a) :ruleset mine)\n")
    with pytest.raises(RuleFileError) as info:
        dq.optimize(long_sum(3), rules=[path])
    err = info.value
    assert err.filename == str(path) and err.line == 3
    assert "Frobnicate" in str(err) and "broken.egg:3:" in str(err)


def test_missing_rule_file():
    with pytest.raises(DlvmError, match="no such rule file"):
        dq.optimize(long_sum(3), rules=["/nonexistent/extra.egg"])


def test_unknown_ruleset_in_schedule():
    s = new_session()
    with pytest.raises(DlvmError, match="nosuch"):
        saturate(s, Schedule(("identities", "nosuch")))


def test_budget_of():
    assert Budget.of(None) == Budget()
    assert Budget.of({"nodes": 5}).nodes == 5
    with pytest.raises(DlvmError, match="unknown budget"):
        Budget.of({"node": 5})
