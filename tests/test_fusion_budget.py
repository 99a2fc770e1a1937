"""The fusion decision's extraction is bounded by its budget's work (expansion steps): past it
greedy keeps what it decided and inlines the rest (a valid decision: checked against the
interpreter), and the report says so. The decision depends on the program and the budget, not
on the clock: under a clock slowed 500-fold it is the same plan, and it is cached; only the
last-resort wall-clock cap cuts by time, and that cut is reported and not cached. Deep programs
plan and compile with a recursion limit far below their depth. Wall times are hang guards, never
timing claims (a noisy machine)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq import cache
from dlvm_eq.cache import watching_time_cuts
from dlvm_eq.codegen import program
from dlvm_eq.egraph.fusion_decision import DEFAULT_BUDGET
from dlvm_eq.extract import fusion_cost
from dlvm_eq.pipeline import plan_function, planning

ROOT = Path(__file__).resolve().parent.parent
LOW_RECURSION_LIMIT = 250  # far short of the programs' depth: any recursion per op fails


def _child(code: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]),
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def test_a_deep_program_is_planned_within_the_fusion_budget():
    # 5,000 ops: unbounded, greedy fusion took 25 s at 2,000 ops and grows quadratically
    r = _child(
        f"""
        import sys, time
        from deep_ladder import ladder_text
        from dlvm_eq.ir.parser import parse
        from dlvm_eq.pipeline import plan_function
        m = parse(ladder_text(1000), "ladder.dl")
        sys.setrecursionlimit({LOW_RECURSION_LIMIT})
        t0 = time.perf_counter()
        plan = plan_function(m["ladder"], m, budget={{"work": 300_000}})
        print(f"{{time.perf_counter() - t0:.2f}}")
        print(plan.fusion)
        """,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    seconds, report = r.stdout.splitlines()[:2]
    print(f"\n5,000-op program planned in {seconds} s: {report}")
    assert "fusion extraction stopped by its budget: work budget" in report
    assert float(seconds) < 120.0  # a hang guard: saturating, 0.3M steps, linear loading


def test_a_five_thousand_op_chain_compiles_without_recursion_headroom():
    # optimize (greedy_dag_sets), unload, fusion, planning and kernels, all iterative
    r = _child(
        f"""
        import sys
        import numpy as np
        import dlvm_eq as dq
        from deep_programs import chain_text
        from dlvm_eq.ir.parser import parse
        m = parse(chain_text(5000), "chain.dl")
        rng = np.random.default_rng(0)
        x, y = (rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2))
        want = dq.interpret(m, "chain", x, y)
        sys.setrecursionlimit({LOW_RECURSION_LIMIT})
        got = dq.compile(m, "chain", "cpu")(x, y)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        print("ok")
        """,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "ok"


def _two_reductions():
    """e is read by two reductions (two kernels): the full search materializes it; with no
    budget at all nothing is decided, e is recomputed by both, and the answer is the same."""
    x = np.random.default_rng(3).standard_normal((64, 48)).astype(np.float32)

    def f(x):
        e = dq.exp(dq.log(x * x + 1.0))
        return e * dq.sum(e, axis=1, keepdims=True) + dq.max(e, axis=0)

    module = dq.make_ir(f)(x)
    return module, module[next(iter(module.functions))], x


def test_the_decision_greedy_leaves_at_its_work_budget_runs_correctly():
    module, fn, x = _two_reductions()
    full = plan_function(fn, module)
    assert "stopped" not in full.fusion.note and full.fusion.materialized >= 1
    with watching_time_cuts() as cuts:
        cut = plan_function(fn, module, budget={"work": 0})
    assert cuts == []  # a work cut is the same on any machine: nothing says "do not cache"
    assert "fusion extraction stopped by its budget: work budget (0 expansion steps)" in (
        cut.fusion.note
    )
    assert cut.fusion.materialized == 0  # only what must be in buffers
    want = dq.interpret(module, fn.name, x, float64=True)
    scale = np.abs(want).max()
    for plan in (cut, full):
        np.testing.assert_allclose(program(plan, "cpu")(x), want, rtol=1e-5, atol=1e-6 * scale)


def test_the_wall_clock_cap_is_a_reported_time_cut(monkeypatch):
    module, fn, x = _two_reductions()
    seen = []

    def no_time(problem, passes=3, time_limit=None, work=None):
        seen.append((time_limit, work))
        return greedy(problem, passes, time_limit=0.0, work=work)

    greedy = fusion_cost.greedy_fusion
    monkeypatch.setattr(fusion_cost, "greedy_fusion", no_time)
    with watching_time_cuts() as cuts:
        cut = plan_function(fn, module, budget={"seconds": 5.0})
    assert seen and 0.0 <= seen[0][0] <= 5.0  # the cap's seconds reach greedy
    assert seen[0][1] == DEFAULT_BUDGET.work  # and the default work
    assert "stopped by its budget: time limit" in cut.fusion.note
    assert cuts and cuts[0].startswith("fusion: time limit")  # not cached (cache.py)
    want = dq.interpret(module, fn.name, x, float64=True)
    got = program(cut, "cpu")(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def _mlp_step_module():
    """The MLP training step of benchmarks/compile_time.py, small: value_and_grad + SGD."""
    from dlvm_eq.models.mlp import init_params, loss

    rng = np.random.default_rng(0)
    params = init_params([24, 16, 4], seed=1)
    x = rng.random((8, 24), dtype=np.float32)
    y = np.eye(4, dtype=np.float32)[rng.integers(0, 4, 8)]
    vg = dq.value_and_grad(loss, argnums=(0, 1, 2, 3))

    def step(w1, b1, w2, b2, x, y):
        value, grads = vg(w1, b1, w2, b2, x, y)
        return value, tuple(p - 0.01 * g for p, g in zip((w1, b1, w2, b2), grads))

    return dq.jit(step).lower(*params, x, y)


TICK = 0.25  # seconds the slowed clock advances per read


def _slow_clock(monkeypatch) -> list:
    """time.perf_counter (every module's: they call it through `time`) advances TICK seconds
    per read and ignores real time: a machine where every step between two clock reads takes
    250 ms, whatever the real load. Two seconds are 8 reads (the stage's old budget); the
    last-resort cap's 60 s are 240, and the MLP step's fusion stage reads it about 70 times.
    Returns a list whose length counts the reads."""
    reads: list = []

    def clock() -> float:
        reads.append(None)
        return len(reads) * TICK

    monkeypatch.setattr(time, "perf_counter", clock)
    return reads


@pytest.mark.parametrize("program_of", [_two_reductions, _mlp_step_module], ids=["two", "mlp"])
def test_the_same_plan_under_a_slow_clock(monkeypatch, program_of):
    """A slow machine (the clock monkeypatched) gets the same plan, and nothing reports a time
    cut: the fusion budget is work. A small cap under the same clock cuts, and says so. (Before
    the work budget, the stage's two seconds under this clock materialized every value of the
    MLP step: the test failed.)"""
    module = program_of()
    module = module[0] if isinstance(module, tuple) else module
    fn = module[next(iter(module.functions))]
    quiet = plan_function(fn, module)
    with monkeypatch.context() as m:
        reads = _slow_clock(m)
        with watching_time_cuts() as cuts:
            slow = plan_function(fn, module)
        assert cuts == []
        assert _plan_text(slow) == _plan_text(quiet)
        assert reads  # the fusion stage reads the clock
        with watching_time_cuts() as cuts:
            capped = plan_function(fn, module, budget={"seconds": 1.0})
        assert cuts  # the cap is the only clock left, and it says when it cuts
        assert "not saturated" in capped.fusion.note or "time limit" in capped.fusion.note


def _plan_text(plan) -> str:
    """The plan's printed text without the fusion report's wall time ("; 12.3 ms")."""
    return re.sub(r"; [0-9.]+ ms", "", str(plan))


def test_a_plan_is_cached_whatever_the_clock(monkeypatch, tmp_path):
    """The default budget's decision is built (a fresh cache: a miss) and stored even when the
    clock is slow, and read back."""
    module = dq.make_ir(lambda a: dq.exp(a) * dq.sum(dq.tanh(a), axis=0) + 0.125)(
        np.ones((5, 3), np.float32)
    )
    name = next(iter(module.functions))
    stats = planning.plan_cache_stats
    old = cache.shared_cache().root
    cache.set_cache_dir(tmp_path)
    try:
        with monkeypatch.context() as m:
            _slow_clock(m)
            misses, cut = stats["misses"], stats["time_cut"]
            first = planning.planned(module, name, "cpu")
            assert stats["misses"] == misses + 1 and stats["time_cut"] == cut
        hits = stats["hits"]
        again = planning.planned(module, name, "cpu")
        assert stats["hits"] == hits + 1 and _plan_text(again) == _plan_text(first)
    finally:
        cache.set_cache_dir(old)
