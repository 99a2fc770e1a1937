"""The fusion decision's extraction is bounded by its budget's seconds: past them greedy keeps
what it decided and inlines the rest (a valid decision: checked against the interpreter), and
the report says so. Deep programs plan and compile with a recursion limit far below their depth.
Wall times are hang guards, never timing claims (a noisy machine)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import dlvm_eq as dq
from dlvm_eq.codegen import program
from dlvm_eq.extract import fusion_cost
from dlvm_eq.pipeline import plan_function

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
        plan = plan_function(m["ladder"], m, budget={{"seconds": 1.0}})
        print(f"{{time.perf_counter() - t0:.2f}}")
        print(plan.fusion)
        """,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    seconds, report = r.stdout.splitlines()[:2]
    print(f"\n5,000-op program planned in {seconds} s: {report}")
    assert "fusion extraction stopped by the time budget" in report
    assert float(seconds) < 60.0  # 1 s saturating + 1 s extracting + linear loading


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


def test_the_decision_greedy_leaves_at_its_time_limit_runs_correctly(monkeypatch):
    # e is read by two reductions (two kernels): the full search materializes it; with no
    # time at all nothing is decided, e is recomputed by both, and the answer is the same
    x = np.random.default_rng(3).standard_normal((64, 48)).astype(np.float32)

    def f(x):
        e = dq.exp(dq.log(x * x + 1.0))
        return e * dq.sum(e, axis=1, keepdims=True) + dq.max(e, axis=0)

    module = dq.make_ir(f)(x)
    fn = module[next(iter(module.functions))]
    full = plan_function(fn, module)
    assert "stopped" not in full.fusion.note and full.fusion.materialized >= 1

    timed = []

    def no_time(problem, passes=3, time_limit=None):
        timed.append(time_limit)
        return greedy(problem, passes, time_limit=0.0)

    greedy = fusion_cost.greedy_fusion
    monkeypatch.setattr(fusion_cost, "greedy_fusion", no_time)
    cut = plan_function(fn, module, budget={"seconds": 5.0})
    assert timed and 0.0 <= timed[0] <= 5.0  # the budget's seconds reach greedy
    assert "fusion extraction stopped by the time budget" in cut.fusion.note
    assert cut.fusion.materialized == 0  # only what must be in buffers
    want = dq.interpret(module, fn.name, x, float64=True)
    np.testing.assert_allclose(program(cut, "cpu")(x), want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(program(full, "cpu")(x), want, rtol=2e-5, atol=2e-5)
