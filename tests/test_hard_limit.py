"""verify/hard_limit.py: a step that no signal stops (a C call) is killed at its limit; a step
that finishes gives its answer; identity.ZeroProver sends gcd-based steps on many symbols there."""

import time

import pytest
import sympy as sp

from dlvm_eq.verify import hard_limit
from dlvm_eq.verify.identity import PROVEN, ZeroProver

pytestmark = pytest.mark.skipif(not hard_limit.can_fork(), reason="needs os.fork")
x, y = sp.symbols("x y")


def _stuck(_):
    time.sleep(60)  # stands for a C call no signal interrupts: the child is killed, not asked
    return 0


def test_a_step_past_its_limit_is_killed_and_undecided():
    t0 = time.monotonic()
    assert hard_limit.decided_in_child(_stuck, x, seconds=0.3) is None
    assert time.monotonic() - t0 < 30  # far below the step's own 60 s: it was killed


def test_a_step_that_finishes_gives_its_answer():
    assert hard_limit.decided_in_child(sp.expand, x * (y + 1) - x * y - x, 10.0) is True
    assert hard_limit.decided_in_child(sp.expand, x * (y + 1) - x * y, 10.0) is False
    assert hard_limit.decided_in_child(lambda e: 1 / 0, x, 10.0) is False  # raised: not zero


def test_the_prover_decides_many_symbols_through_a_child(monkeypatch):
    many = sp.symbols(f"a0:{hard_limit.MANY_SYMBOLS + 2}")
    s = sum(many)
    d = sp.tanh(s) - (sp.exp(2 * s) - 1) / (sp.exp(2 * s) + 1)  # needs a gcd-based step
    calls = []
    real = hard_limit.decided_in_child

    def spy(step, expr, seconds):
        calls.append(expr)
        return real(step, expr, seconds)

    monkeypatch.setattr("dlvm_eq.verify.identity.decided_in_child", spy)
    assert ZeroProver(timeout=60.0).status(d) == PROVEN
    assert calls  # decided in a child, not in this process
