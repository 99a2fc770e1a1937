"""A jitted gradient of attention saturates once, with its adjoint (issue 32): the attention
rules run in the adjoint's e-graph behind the never-slower guard (egraph/attention_guarded.py),
and the module's second pass is skipped, giving the plan that the second pass gave."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq import config
from dlvm_eq.ad.driver import adjoint_function
from dlvm_eq.egraph import optimize as optimize_mod
from dlvm_eq.ir.interp import interpret
from dlvm_eq.ir.module import Module
from dlvm_eq.pipeline import native, never_slower, targets
from dlvm_eq.pipeline.never_slower import ProgramChoice


@pytest.fixture
def saturations(monkeypatch):
    """optimize_session calls, every adjoint built (the IR cache off)."""
    monkeypatch.setenv("DLVM_EQ_NO_IR_CACHE", "1")
    config.reload()
    calls = []
    real = optimize_mod.optimize_session
    monkeypatch.setattr(
        optimize_mod, "optimize_session", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    native._optimized.clear()
    yield calls
    monkeypatch.delenv("DLVM_EQ_NO_IR_CACHE")
    config.reload()


def heads(q, k, v, w):
    s = (q @ dq.transpose(k, (0, 1, 3, 2))) * 0.125
    return dq.sum(dq.softmax(s, axis=-1) @ v * w)


def _args(shape, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]


def _step(q, k, v, w):
    value, grads = dq.value_and_grad(heads, argnums=(0, 1, 2))(q, k, v, w)
    return value, tuple(p - 0.1 * g for p, g in zip((q, k, v), grads))


def _plan(f, args) -> list[str]:
    return [line for line in str(f.report(*args).plan).splitlines() if "ms" not in line]


def test_an_attention_step_skips_the_second_pass_with_the_same_plan(saturations, monkeypatch):
    args = _args((2, 2, 32, 16))
    once = dq.jit(_step)
    out_once = once(*args)
    report = once.report(*args)
    assert "second pass skipped" in report.note
    # the attention rules ran in the adjoint's e-graph (the flash row term matched) and their
    # form was weighed, not taken: extraction's gain is within the cost model's error
    (adjoint,) = report.adjoints
    assert any(r.startswith("flash backward") for r in adjoint.saturation.rule_matches)
    assert "attention rules' form not taken" in adjoint.note
    monkeypatch.setattr(targets.Saturated, "covers", lambda self, module, name: False)
    native._optimized.clear()
    twice = dq.jit(_step)
    out_twice = twice(*args)
    assert "second pass skipped" not in twice.report(*args).note
    assert _plan(once, args) == _plan(twice, args)
    for a, b in zip(out_once[1], out_twice[1]):
        np.testing.assert_array_equal(a, b)


def test_the_guard_decides_where_extraction_predicts_a_gain(saturations, monkeypatch):
    """With no margin (error -1), the guard plans both forms: it keeps the program without
    the flash row term (predicted slower after fusion), and the plan is the same."""
    args = _args((2, 2, 32, 16), seed=1)
    plain = dq.jit(_step)
    plain(*args)
    monkeypatch.setattr(never_slower, "PREDICTION_ERROR", -1.0)
    native._optimized.clear()
    asked = dq.jit(_step)
    asked(*args)
    (adjoint,) = asked.report(*args).adjoints
    assert "attention rules' form: never slower: kept the original" in adjoint.note
    assert _plan(asked, args) == _plan(plain, args)


def _always_optimized(old, new, module, stable=()):
    return ProgramChoice("optimized", 2.0, 1.0, 0.0, "a test's guard")


_always_optimized.error = -1.0  # type: ignore[attr-defined]


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    t=st.sampled_from([8, 16, 24]),
    d=st.sampled_from([4, 8]),
    seed=st.integers(0, 2**16),
)
def test_the_attention_rules_form_equals_the_interpreter_in_float64(saturations, t, d, seed):
    """Where the guard keeps the attention rules' form (a guard that always does), the
    gradient still equals the reference interpreter's in float64 on the program as traced."""
    args = _args((1, 2, t, d), seed)
    module = dq.make_ir(heads)(*args)
    fn = module["heads"]
    taken = adjoint_function(module, fn, wrt=(0, 1, 2), keeping=(0,), guard=_always_optimized)
    unguarded = adjoint_function(module, fn, wrt=(0, 1, 2), keeping=(0,))
    assert str(taken) != str(unguarded)  # the flash row term: another program
    want = _reference64(*args)
    for adj in (taken, unguarded):
        m = Module("t")
        m.add(adj)
        got = interpret(m, adj.name, *args, float64=True)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-11)


def _reference64(q, k, v, w):
    """(loss, dQ, dK, dV) of heads() in float64 numpy, by the attention backward's formulas."""
    q, k, v, w = (a.astype(np.float64) for a in (q, k, v, w))
    s = q @ np.swapaxes(k, -1, -2) * 0.125
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = w @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return (
        np.sum(p @ v * w),
        ds @ k * 0.125,
        np.swapaxes(ds, -1, -2) @ q * 0.125,
        np.swapaxes(p, -1, -2) @ w,
    )


# ---------------------------------------------------------------- the forward's e-graph, skipped


def rank3(q, k, v, w):
    return dq.sum(dq.softmax(q @ dq.transpose(k, (0, 2, 1)), axis=-1) @ v * w)


def biased(q, k, v, w):
    s = (q @ dq.transpose(k, (0, 1, 3, 2))) * 0.125 + w[:, :, :, :1]
    return dq.sum(dq.softmax(s, axis=-1) @ v)


@pytest.mark.parametrize(
    "fn, shape",
    [
        (heads, (1, 2, 16, 8)),
        (heads, (1, 4, 256, 64)),
        (heads, (2, 4, 128, 32)),
        (heads, (1, 4, 1024, 64)),  # fused pays: the forward's e-graph decides
        (heads, (1, 1, 2048, 16)),
        (rank3, (2, 16, 8)),
        (rank3, (1, 1024, 64)),
    ],
)
def test_the_plain_decision_read_off_the_ir_is_the_forward_e_graphs(monkeypatch, fn, shape):
    """attention_forward.plain_pays_as_written says "plain" only where the forward's e-graph
    (the path it skips) also keeps the program unfused; elsewhere that e-graph decides."""
    from dlvm_eq.egraph import attention_forward as af

    args = _args(shape)
    module = dq.make_ir(fn)(*args)
    f = module[fn.__name__]
    plain = af.plain_pays_as_written(f, "cpu")
    monkeypatch.setattr(af, "plain_pays_as_written", lambda *a: False)  # the full path
    fused = af.with_fused_attention(module, f, "cpu", None) is not f
    assert not (plain and fused), (plain, fused)
    if shape in ((1, 4, 1024, 64), (1, 1, 2048, 16)):
        assert fused and not plain  # where fusing pays, the e-graph is still asked


def test_a_bias_leaves_the_decision_to_the_forward_e_graph():
    from dlvm_eq.egraph.attention_forward import plain_pays_as_written

    module = dq.make_ir(biased)(*_args((1, 2, 16, 8)))
    assert not plain_pays_as_written(module["biased"], "cpu")
