"""Every use of saturation goes through the one budgeted driver (egraph/saturate.py), with the
caller's deadline: the adjoint's budget seconds cover its expansion and its optimization."""

import time

import numpy as np
import pytest

from dlvm_eq.egraph import load_bindings
from dlvm_eq.egraph.deadline import Deadline
from dlvm_eq.egraph.rulefiles import rule_file
from dlvm_eq.ir import F64, FunctionBuilder, Module, tensor
from dlvm_eq.ir.interp import run_function


def _module():
    b = FunctionBuilder("f", [tensor(3, F64)], ["x"])
    (x,) = b.params
    y = b.emit("tanh", [b.emit("multiply", [x, x])])
    m = Module("m")
    m.add(b.finish(b.emit("reduce", [y], combinator="add", init=0.0, axes=(0,))))
    return m


def test_the_adjoint_budget_counts_from_before_the_expansion(monkeypatch):
    load_bindings()
    from dlvm_eq.ad import adjoint_function
    from dlvm_eq.egraph import optimize, saturate

    calls = []
    real_saturate, real_optimize = saturate.saturate, optimize.optimize_session

    def saturating(session, schedule=None, budget=None, **kw):
        calls.append(("saturate", schedule.rulesets if schedule else None, time.perf_counter()))
        return real_saturate(session, schedule, budget, **kw)

    def optimizing(session, programs, **kw):
        calls.append(("optimize", kw.get("deadline"), time.perf_counter()))
        return real_optimize(session, programs, **kw)

    monkeypatch.setattr(saturate, "saturate", saturating)
    monkeypatch.setattr(optimize, "optimize_session", optimizing)
    m = _module()
    # a rule file passed in: not read from the function cache, so the e-graph is built here
    g = adjoint_function(m, m["f"], rules=rule_file("adjoint.egg"), budget={"seconds": 5.0})
    expansion = next(c for c in calls if c[0] == "saturate" and c[1] == ("adjoint",))
    deadline = next(c[1] for c in calls if c[0] == "optimize")
    assert isinstance(deadline, Deadline) and deadline.seconds == 5.0
    assert deadline.start <= expansion[2]
    x = np.array([0.1, -0.4, 0.7])
    np.testing.assert_allclose(
        run_function(None, g, [x], float64=True), 2 * x * (1 - np.tanh(x * x) ** 2), rtol=1e-12
    )


def test_the_layout_encodings_of_the_baseline_run_through_the_driver(monkeypatch):
    load_bindings()
    from dlvm_eq.egraph import optimize

    schedules = []
    real = optimize.saturate

    def saturating(session, schedule=None, budget=None, **kw):
        schedules.append(schedule.rulesets)
        return real(session, schedule, budget, **kw)

    monkeypatch.setattr(optimize, "saturate", saturating)
    m = _module()
    with optimize.scratch_session() as s:
        cost = optimize.baseline_cost(s, [s.add_function(m["f"], m)])
    assert schedules == [("layout",)]
    assert cost == pytest.approx(optimize.program_cost(m["f"], m), rel=1e-12)
