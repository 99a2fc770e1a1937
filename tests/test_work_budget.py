"""Budgets counted in work, not seconds (egraph/deadline.py, egraph/saturate.py, extract/improve.py):
the same program compiles to the same optimized IR and plan on a busy machine as on a quiet
one. A busy machine is a clock that runs ten times fast (every second looks like ten to every
deadline); the compiles under it must be byte-identical to the normal ones, with no time cut
noted, for random programs, a 32-step GRU's value-and-gradient (which the work budget cuts) and
a 512-layer tanh chain's gradient. A program past the work budget is cut the same way every time,
and the cut is no time cut (so it may be cached); the wall clock remains a safety net that still
cuts, and says so."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from ir_programs import functions
from test_shared_sessions import _compiled  # (optimized IR, adjoint IR, plan) as text

import dlvm_eq as dq
from dlvm_eq.cache import watching_time_cuts
from dlvm_eq.egraph import optimize_loops
from dlvm_eq.egraph.deadline import extraction_work, step_work
from dlvm_eq.egraph.ruleset_schedule import Budget
from dlvm_eq.extract.graph import load_json
from dlvm_eq.extract.greedy import greedy_dag_choice
from dlvm_eq.extract.improve import improve_choice
from dlvm_eq.ir import Module
from dlvm_eq.ir.parser import load

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import egraph_models  # noqa: E402  (no side effects at import)

FAST = 10.0  # every second looks like ten
BLOWUP = Path(__file__).parent / "data" / "blowup"
TIMING = re.compile(r"; [0-9.]+ [mun]?s\b")  # a plan's measured times, not its content


class _Clock:
    """time.perf_counter, optionally running `FAST` times fast from the moment it is switched."""

    def __init__(self, monkeypatch):
        self.real = time.perf_counter
        monkeypatch.setattr(time, "perf_counter", self.now)
        self.factor, self.base = 1.0, self.real()

    def now(self) -> float:
        t = self.real()
        return self.base + (t - self.base) * self.factor

    def fast(self, on: bool) -> None:
        self.base, self.factor = self.real(), (FAST if on else 1.0)


@pytest.fixture
def clock(monkeypatch):
    return _Clock(monkeypatch)


def _fresh():
    """No compile reads what an earlier one left in memory (the IR cache is off: no_ir_cache)."""
    from dlvm_eq.pipeline import native

    native._optimized.clear()
    optimize_loops._JOINT.clear()


def _twice(clock, build):
    """build() on the normal clock, then on the fast one: (texts, time cuts) of each."""
    out = []
    for fast in (False, True):
        _fresh()
        clock.fast(fast)
        with watching_time_cuts() as cuts:
            text = build()
        clock.fast(False)
        out.append((text, list(cuts)))
    return out


def _same(clock, build) -> str:
    (normal, cuts_normal), (busy, cuts_busy) = _twice(clock, build)
    assert not cuts_normal and not cuts_busy, (cuts_normal, cuts_busy)
    assert normal == busy
    return normal


def test_the_fast_clock_runs_fast(clock):
    clock.fast(True)
    t0 = time.perf_counter()
    time.sleep(0.05)
    assert time.perf_counter() - t0 >= 0.4


SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@settings(max_examples=10, **SETTINGS)
@given(functions(n_ops=14))
def test_random_programs_compile_the_same_on_a_busy_machine(fn):
    # (fixtures by hand: hypothesis runs the body many times per fixture)
    from dlvm_eq import config

    module = Module("m")
    module.add(fn)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("DLVM_EQ_NO_IR_CACHE", "1")
        config.reload()
        try:
            clock = _Clock(m)
            _same(clock, lambda: _compiled(fn, module))
        finally:
            m.delenv("DLVM_EQ_NO_IR_CACHE")
            config.reload()


def _gru32() -> str:
    (model,) = [m for m in egraph_models.MODELS if m.__name__ == "gru_32"]
    _, module, name, _ = egraph_models.build(model, algebra=True)
    plan = dq.compile(module, name).report.plan
    return str(module) + TIMING.sub("", str(plan))


def test_a_32_step_gru_is_cut_by_work_the_same_on_a_busy_machine(clock, no_ir_cache):
    from dlvm_eq.ad.driver import adjoint_reports

    with adjoint_reports() as reports:
        text = _same(clock, _gru32)
    # the work budget cut it (where the 3-second budget did on a quiet machine, session 17)
    stops = {r.saturation.stop_reason for r in reports if r.saturation is not None}
    assert stops == {"work"}, stops
    assert "dot" in text


def _tanh_chain(depth: int) -> str:
    def deep(x):
        for _ in range(depth):
            x = dq.tanh(x * x + x)
        return dq.sum(x)

    f = dq.jit(dq.grad(deep))
    x = np.linspace(-0.5, 0.5, 6).astype(np.float32)
    f(x)
    return TIMING.sub("", str(f.report(x).plan))


def test_a_512_layer_tanh_chain_plans_the_same_on_a_busy_machine(clock, no_ir_cache):
    plan = _same(clock, lambda: _tanh_chain(512))
    assert "10 kernels" in plan.splitlines()[0]  # what a quiet machine planned (session 17)


def _blowup(budget):
    module = load(BLOWUP / "sum24.dl")
    r = dq.optimize(module, rules=[BLOWUP / "blowup.egg"], budget=budget, never_slower=False)
    fr = r.report["f"]
    return str(r.module), fr.saturation


def test_a_program_past_the_work_budget_is_cut_the_same_way_every_time(clock, no_ir_cache):
    budget = {"work": 300_000}
    runs = _twice(clock, lambda: _blowup(budget)) + _twice(clock, lambda: _blowup(budget))
    texts = {text for (text, _), _ in runs}
    assert len(texts) == 1  # the same program, every time, on either clock
    for (_, sat), cuts in runs:
        assert not cuts  # a cut by work is no time cut: it may be cached
        assert sat.stop_reason == "work" and sat.work <= budget["work"]
        assert "work budget (300,000) reached" in str(sat) and f"work {sat.work:,}" in str(sat)
    # more work, a larger e-graph
    _, more = _blowup({"work": 900_000})
    assert more.nodes > runs[0][0][1].nodes


def test_the_clock_remains_a_safety_net_and_says_so(no_ir_cache):
    with watching_time_cuts() as cuts:
        _, sat = _blowup({"seconds": 0.3, "work": 10**12, "nodes": 10**9})
    assert sat is None or sat.stop_reason == "seconds"
    assert cuts, "a cut by the clock must be noted (not cached)"


def test_step_and_extraction_work_grow_with_what_they_count():
    assert step_work(1000, 2, 0, 0) > step_work(1000, 1, 0, 0) > step_work(10, 1, 0, 0)
    assert step_work(10, 1, 500, 0) > step_work(10, 1, 0, 0)
    assert step_work(10, 1, 0, 50) > step_work(10, 1, 0, 0)
    assert extraction_work(20_000) > extraction_work(10) > 0
    assert Budget().seconds >= 100 * 3  # a safety net far above the 3 s the work replaced
    assert Budget.of({"work": 5}).work == 5


def _chain_graph(n: int):
    """An e-graph where each of n classes has two e-nodes: greedy and the local search have
    work to do (sibling classes that pay off only by sharing one value)."""
    nodes = {"s": {"op": "s", "children": [], "eclass": "S", "cost": 6.0}}
    kids = []
    for i in range(n):
        nodes[f"a{i}"] = {"op": "a", "children": [], "eclass": f"A{i}", "cost": 5.0}
        nodes[f"b{i}"] = {"op": "b", "children": ["s"], "eclass": f"A{i}", "cost": 0.0}
        kids.append(f"a{i}")
    nodes["r"] = {"op": "r", "children": kids, "eclass": "R", "cost": 1.0}
    return load_json({"nodes": nodes, "root_eclasses": ["R"]})


def test_the_local_search_stops_on_work_the_same_way_on_a_busy_machine(clock):
    g = _chain_graph(300)

    def search(work, fast):
        clock.fast(fast)
        with watching_time_cuts() as cuts:
            ch = improve_choice(
                g, g.costs, greedy_dag_choice(g, g.costs, g.roots), g.roots, work=work
            )
        clock.fast(False)
        return ch, list(cuts)

    full, cuts = search(10**9, False)
    assert not cuts
    short, _ = search(5, False)
    assert short != full  # a tiny work budget stops it early...
    assert search(5, True) == (short, [])  # ... the same way on a busy machine, no time cut
    assert search(10**9, True) == (full, [])
    # the clock as a safety net: a search it stops is a time cut
    with watching_time_cuts() as cuts:
        improve_choice(g, g.costs, greedy_dag_choice(g, g.costs, g.roots), g.roots, time_limit=-1.0)
    assert cuts
