"""A time budget bounds saturation and extraction, not compiling the rule files into egglog:
a fresh (cold) process, whose first session takes a second or more to make (several on a busy
machine), optimizes to the program a warm one does. Counted against the budget, the cold
session stopped saturation early, and a fresh subprocess computed other bits than the test
process (test_determinism flaked so). Each thread has its own sessions, so a new thread is a
cold start here; the session's making is slowed past the whole budget."""

from __future__ import annotations

import threading
import time

import numpy as np

import dlvm_eq as dq
from dlvm_eq import config
from dlvm_eq.egraph import optimize as optimize_mod

# The budget; the cold session takes longer than all of it. Saturating this small program
# takes about 0.1 s quiet, but at a load of 11 the warm run once ran past 0.6 s by itself
# (test_..._adjoint_budget failed); 2 s leaves room for a busy machine.
SECONDS = 2.0


def _chain():
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((64, 8), (8, 64), (64, 2)))
    return dq.make_ir(
        lambda a, b, c: dq.exp((a @ b) @ c) * 2.0 + dq.transpose(dq.transpose(a @ b) * 1.0)[:, :2]
    )(a, b, c)


def _in_a_cold_thread(monkeypatch, work):
    """work() on a new thread (no session yet) whose sessions take SECONDS + 0.3 s to make."""
    real = optimize_mod.new_session

    def slow_session(*args, **options):  # new_session's own arguments, passed on as given
        time.sleep(SECONDS + 0.3)
        return real(*args, **options)

    out: list = []
    with monkeypatch.context() as m:
        m.setattr(optimize_mod, "new_session", slow_session)
        t = threading.Thread(target=lambda: out.append(work()))
        t.start()
        t.join(120)
    assert out, "the cold thread raised (see the captured output)"
    return out[0]


def test_a_cold_session_does_not_count_against_the_optimize_budget(monkeypatch):
    module = _chain()
    budget = {"seconds": SECONDS}
    warm = dq.optimize(module, budget=budget)
    cold = _in_a_cold_thread(monkeypatch, lambda: dq.optimize(module, budget=budget))
    (fw,), (fc,) = warm.report.functions.values(), cold.report.functions.values()
    assert fw.saturation.stop_reason == "saturated"
    assert fc.saturation is not None and fc.saturation.stop_reason == "saturated", fc
    assert str(cold.module) == str(warm.module)


def test_a_cold_session_does_not_count_against_the_adjoint_budget(monkeypatch):
    monkeypatch.setenv("DLVM_EQ_NO_IR_CACHE", "1")  # really differentiate in each thread
    config.reload()
    from dlvm_eq.ad.driver import adjoint_function

    module = _chain()
    fn = next(iter(module.functions.values()))
    budget = {"seconds": SECONDS}
    warm = adjoint_function(module, fn, budget=budget)
    cold = _in_a_cold_thread(monkeypatch, lambda: adjoint_function(module, fn, budget=budget))
    assert str(cold) == str(warm)
