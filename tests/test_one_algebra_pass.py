"""Where the algebra runs on a jitted gradient (pipeline/differentiate.EXPAND_ONLY_UNDER_JIT):
by default where the gradient is made (adjoint and algebra in one e-graph) and again over the
jitted module; with the switch on, a gradient under a native jit is only expanded at trace time
and the traced module is optimized once. The plan's cache key is derived from the optimizer's
input key, not from printing the optimized module again."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq import config
from dlvm_eq.cache import note_time_cut
from dlvm_eq.egraph import optimize as optimize_mod
from dlvm_eq.pipeline import differentiate, native, planning


@pytest.fixture
def saturations(monkeypatch):
    """The number of algebra saturations (optimize_session calls), with the IR cache off so
    that everything is built."""
    monkeypatch.setenv("DLVM_EQ_NO_IR_CACHE", "1")
    config.reload()
    calls = []
    real = optimize_mod.optimize_session

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(optimize_mod, "optimize_session", counted)
    native._optimized.clear()
    yield calls
    monkeypatch.delenv("DLVM_EQ_NO_IR_CACHE")
    config.reload()


def loss(w, x):
    return dq.sum(dq.tanh(x @ w) * 1.0 + 0.0)


W = np.linspace(-1, 1, 12).reshape(4, 3).astype(np.float32)
X = np.linspace(0, 2, 20).reshape(5, 4).astype(np.float32)


def expected_grad(w, x):
    t = np.tanh(x.astype(np.float64) @ w)
    return x.T.astype(np.float64) @ (1 - t**2)


@pytest.mark.parametrize("expand_only, passes", [(False, 2), (True, 1)])
def test_a_jitted_gradients_algebra_passes(saturations, monkeypatch, expand_only, passes):
    monkeypatch.setattr(differentiate, "EXPAND_ONLY_UNDER_JIT", expand_only)
    value, g = dq.jit(dq.value_and_grad(loss))(W, X)
    assert len(saturations) == passes
    np.testing.assert_allclose(g, expected_grad(W, X), rtol=1e-5)
    assert value == pytest.approx(np.tanh(X.astype(np.float64) @ W).sum(), rel=1e-5)


def test_a_gradient_outside_a_native_jit_is_optimized_where_it_is_made(saturations):
    ir = dq.make_ir(dq.grad(loss))(W, X)  # nothing optimizes it later
    assert len(saturations) == 1
    assert "multiply" not in str(ir)  # x * 1.0 went away with the algebra
    dq.jit(dq.grad(loss), target="interp")(W, X)
    assert len(saturations) == 2


def test_an_inner_gradient_is_optimized_before_the_outer_one_differentiates_it(
    saturations, monkeypatch
):
    monkeypatch.setattr(differentiate, "EXPAND_ONLY_UNDER_JIT", True)

    def f(x):
        return dq.sum(dq.sin(x) * x)

    hvp = dq.jit(dq.grad(lambda x: dq.sum(dq.grad(f)(x) * 2.0)))
    x = np.linspace(-1, 1, 5)
    got = hvp(x)
    # d/dx 2 (cos x * x + sin x) = 2 (2 cos x - x sin x)
    np.testing.assert_allclose(got, 2 * (2 * np.cos(x) - x * np.sin(x)), rtol=1e-10)
    assert len(saturations) == 2  # the inner gradient's, then the whole program's


def _module():
    return dq.make_ir(lambda w, x: dq.sum(dq.exp(x @ w) * 2.0))(W, X)


def test_the_plan_key_derives_from_the_optimizers_key(monkeypatch):
    native._optimized.clear()
    printed = []
    real = planning.print_module
    monkeypatch.setattr(planning, "print_module", lambda m: printed.append(m) or real(m))
    m = _module()
    first = native.lower(m, next(iter(m.functions)), "cpu")
    assert printed == []  # derived from the optimizer's input key
    native._optimized.clear()
    again = native.lower(m, next(iter(m.functions)), "cpu")
    assert str(again.plan) == str(first.plan) and printed == []
    native.lower(m, next(iter(m.functions)), "cpu", optimize=False)
    assert len(printed) == 1  # no optimizer key: the module's text


def test_a_time_cut_optimization_keys_its_plan_by_its_text(monkeypatch):
    """A program a time budget cut short is not what another process builds for the same
    input: its plan must not be stored under the input's key."""
    native._optimized.clear()
    monkeypatch.setenv("DLVM_EQ_NO_IR_CACHE", "0")
    real_optimize = optimize_mod.optimize

    def cut(*args, **kwargs):
        note_time_cut("a test's budget")
        return real_optimize(*args, **kwargs)

    monkeypatch.setattr(optimize_mod, "optimize", cut)
    printed = []
    real = planning.print_module
    monkeypatch.setattr(planning, "print_module", lambda m: printed.append(m) or real(m))
    m = dq.make_ir(lambda w, x: dq.sum(dq.exp(x @ w) * 3.0))(W, X)
    native.lower(m, next(iter(m.functions)), "cpu")
    assert len(printed) == 1


def test_the_report_splits_the_compile_into_exclusive_phases(saturations):
    import time

    f = dq.jit(dq.value_and_grad(lambda w, x: dq.sum(dq.sin(x @ w) * 2.0)))
    t0 = time.perf_counter()
    f(W, X)
    wall = time.perf_counter() - t0
    phases = f.report(W, X).phases
    assert {"trace", "adjoint", "optimize", "plan", "kernels"} <= set(phases)
    assert all(s >= 0 for s in phases.values())
    assert sum(phases.values()) <= wall  # no phase counted inside another as well
