"""Where the algebra runs on a jitted gradient (pipeline/differentiate.EXPAND_ONLY_UNDER_JIT):
by default where the gradient is made (adjoint and algebra in one e-graph, issue 32), and the
jitted module's own pass is skipped when the traced function is that adjoint plus elementwise
ops (pipeline/targets.Saturated); with the switch on, a gradient under a native jit is only
expanded at trace time and the traced module is optimized once. The plan's cache key is
derived from the optimizer's input key, not from printing the optimized module again."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


@pytest.mark.parametrize("expand_only, passes", [(False, 1), (True, 1)])
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
    assert {"trace", "adjoint", "plan", "kernels"} <= set(phases)
    assert all(s >= 0 for s in phases.values())
    assert sum(phases.values()) <= wall  # no phase counted inside another as well


# ---------------------------------------------------------------- issue 32: one pass under jit


def _grad64(f, args, i, eps=1e-6):
    """Central differences in float64 of f(*args) along every element of argument i."""
    args = [np.asarray(a, np.float64) for a in args]
    out = np.zeros_like(args[i])
    for k in np.ndindex(args[i].shape):
        hi, lo = [a.copy() for a in args], [a.copy() for a in args]
        hi[i][k] += eps
        lo[i][k] -= eps
        out[k] = (f(*hi) - f(*lo)) / (2 * eps)
    return out


def _loss64(w, x):
    return np.tanh(x @ w).sum()


def _sgd(w, x):
    value, g = dq.value_and_grad(loss)(w, x)
    return value, w - 0.5 * g


def test_a_jitted_sgd_step_saturates_once_and_skips_the_modules_pass(saturations):
    f = dq.jit(_sgd)
    value, new_w = f(W, X)
    assert len(saturations) == 1  # the adjoint's e-graph only: the SGD update is elementwise
    report = f.report(W, X)
    assert "second pass skipped" in report.note and report.optimize is None
    want = W - 0.5 * _grad64(_loss64, (W, X), 0)
    np.testing.assert_allclose(new_w, want, rtol=0, atol=1e-5 * np.abs(want).max())
    assert value == pytest.approx(_loss64(W.astype(np.float64), X), rel=1e-5)


def test_a_product_after_the_gradient_keeps_the_modules_pass(saturations):
    """An op outside the adjoint that the algebra may rewrite (a product, a reduction): the
    module is optimized as a whole, as before."""

    def f(w, x):
        return dq.grad(loss)(w, x) @ dq.transpose(w)

    got = dq.jit(f)(W, X)
    assert len(saturations) == 2
    want = _grad64(_loss64, (W, X), 0) @ W.T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_a_time_cut_adjoint_keeps_the_modules_pass(saturations, monkeypatch):
    """An adjoint whose saturation a time budget cut short is not saturated: the module's
    pass runs on it (and the recorded trace holds nothing)."""
    from dlvm_eq.egraph import saturate as saturate_mod  # the driver imports it when it runs

    real_saturate = saturate_mod.saturate

    def cut(*args, **kwargs):
        note_time_cut("a test's budget")
        return real_saturate(*args, **kwargs)

    monkeypatch.setattr(saturate_mod, "saturate", cut)
    g = dq.jit(dq.grad(loss))(W, X)
    assert len(saturations) == 2
    np.testing.assert_allclose(g, expected_grad(W, X), rtol=1e-5)


def test_a_jitted_gradient_with_user_rules_keeps_the_modules_pass(saturations, tmp_path):
    rules = tmp_path / "mine.egg"
    rules.write_text("(ruleset mine)\n(rewrite (Tanh (Tanh x)) (Tanh (Tanh x)) :ruleset mine)\n")
    g = dq.jit(dq.grad(loss), rules=[str(rules)])(W, X)
    assert len(saturations) == 2  # the user's rulesets run in the module's pass only
    np.testing.assert_allclose(g, expected_grad(W, X), rtol=1e-5)


def test_the_skipped_pass_gives_the_plan_the_second_pass_gave(monkeypatch):
    """Without the record (covers -> False) the module's pass runs; the planned programs
    are the same (the MLP step's softmax cross-entropy and SGD, small)."""
    from dlvm_eq.models.mlp import loss as mlp_loss
    from dlvm_eq.pipeline import targets

    rng = np.random.default_rng(3)
    args = [
        rng.standard_normal((6, 5)).astype(np.float32),
        rng.standard_normal(5).astype(np.float32),
        rng.standard_normal((5, 3)).astype(np.float32),
        rng.standard_normal(3).astype(np.float32),
        rng.standard_normal((4, 6)).astype(np.float32),
        np.eye(3, dtype=np.float32)[[0, 2, 1, 0]],
    ]
    vg = dq.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3))

    def step(w1, b1, w2, b2, x, y):
        value, grads = vg(w1, b1, w2, b2, x, y)
        return value, tuple(p - 0.1 * g for p, g in zip((w1, b1, w2, b2), grads))

    once = dq.jit(step)
    out_once = once(*args)
    assert "second pass skipped" in once.report(*args).note
    monkeypatch.setattr(targets.Saturated, "covers", lambda self, module, name: False)
    native._optimized.clear()
    twice = dq.jit(step)
    out_twice = twice(*args)
    assert "second pass skipped" not in twice.report(*args).note
    plan = lambda f: [line for line in str(f.report(*args).plan).splitlines() if "ms" not in line]
    assert plan(once) == plan(twice)
    for a, b in zip(out_once[1], out_twice[1]):
        np.testing.assert_array_equal(a, b)


UNARY = {
    "tanh": (dq.tanh, np.tanh),
    "sin": (dq.sin, np.sin),
    "sigmoid": (dq.sigmoid, lambda v: 1 / (1 + np.exp(-v))),
    "square": (lambda v: v * v, lambda v: v * v),
    "exp_half": (lambda v: dq.exp(v * 0.5), lambda v: np.exp(v * 0.5)),
}


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(st.sampled_from(sorted(UNARY)), min_size=1, max_size=4),
    mix=st.lists(st.booleans(), min_size=4, max_size=4),
    lr=st.sampled_from([0.1, 0.5]),
)
def test_random_sgd_steps_saturate_once_and_match_float64(saturations, ops, mix, lr):
    """Random losses (unary chains on x @ w, some steps mixed with x @ w again) stepped by SGD
    under jit: one saturation, and the step equals float64 central differences."""

    def build(lib, matmul):
        def f(w, x):
            h = matmul(x, w)
            v = h
            for op, again in zip(ops, mix):
                v = UNARY[op][lib](v)
                if again:
                    v = v + h
            return (v.sum() if lib else dq.sum(v)) * 0.25

        return f

    loss_dq, loss64 = build(0, lambda x, w: x @ w), build(1, lambda x, w: x @ w)

    def step(w, x):
        value, g = dq.value_and_grad(loss_dq)(w, x)
        return value, w - lr * g

    saturations.clear()
    value, new_w = dq.jit(step)(W * 0.3, X * 0.3)
    assert len(saturations) == 1
    w64, x64 = (W * 0.3).astype(np.float64), (X * 0.3).astype(np.float64)
    want = w64 - lr * _grad64(loss64, (w64, x64), 0)
    np.testing.assert_allclose(new_w, want, rtol=0, atol=1e-4 * np.abs(want).max())
    assert value == pytest.approx(loss64(w64, x64), rel=1e-4, abs=1e-6)
