"""A jitted gradient's compile report shows the e-graph that built its adjoint (issue 32: the
algebra saturates there once, and the module's second pass is skipped): the rules that really
fired, the e-graph's size, why saturation stopped and the cost extracted; on a compile-cache
hit it says so, with no figures. And an update outside the adjoint that holds an op a
numerically stable form starts from (pipeline/targets.STABLE_HEADS) keeps the module's pass."""

from __future__ import annotations

import re

import numpy as np

import dlvm_eq as dq
from dlvm_eq.cache import set_cache_dir
from dlvm_eq.egraph.rulefiles import rule_file
from dlvm_eq.pipeline import targets

W = np.linspace(-1, 1, 12).reshape(4, 3).astype(np.float32)
X = np.linspace(0, 2, 20).reshape(5, 4).astype(np.float32)


# elementwise losses of vectors: few rules fire, so the report's top rules show them all
V = np.linspace(-1, 1, 7).astype(np.float32)
U = np.linspace(0.5, 2, 7).astype(np.float32)


def log_of_exp(w, x):
    return dq.sum(dq.log(dq.exp(x * w)) * dq.tanh(x * w))


def no_log(w, x):
    return dq.sum(dq.tanh(x * w) * dq.sin(x * w))


def _report(fn):
    step = dq.jit(dq.value_and_grad(fn))
    step(V, U)
    return step.report(V, U)


def test_the_report_lists_the_rules_that_fired_in_the_adjoints_e_graph(no_ir_cache):
    report = _report(log_of_exp)
    assert "second pass skipped" in report.note and report.optimize is None
    (adjoint,) = report.adjoints
    assert adjoint.of == "log_of_exp" and not adjoint.from_cache
    sat = adjoint.saturation
    assert sat.rule_matches.get("log-exp", 0) > 0  # log(exp(x @ w)) = x @ w must fire
    text = str(report)
    head = (
        "e-graph (the adjoint of @log_of_exp, forward and gradient together): "
        f"{adjoint.e_classes} e-classes, e-nodes {sat.nodes_before} -> {sat.nodes}"
    )
    assert head in text and sat.nodes > sat.nodes_before
    fired = next(line for line in text.splitlines() if "rules fired:" in line)
    assert re.search(r"\blog-exp x\d+", fired)
    assert "cost (model): " in text and adjoint.cost > 0
    # the gradient is right: d/dw sum(h * tanh h), h = x * w
    h = U.astype(np.float64) * V
    want = U * (np.tanh(h) + h * (1 - np.tanh(h) ** 2))
    value, g = dq.jit(dq.value_and_grad(log_of_exp))(V, U)
    np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)


def test_a_rule_that_cannot_fire_is_not_listed(no_ir_cache):
    report = _report(no_log)
    (adjoint,) = report.adjoints
    assert adjoint.saturation is not None and adjoint.saturation.rule_matches
    assert "log-exp" not in adjoint.saturation.rule_matches
    assert "log-exp" not in str(report)


def test_a_cache_hit_says_so_without_figures(tmp_path):
    set_cache_dir(tmp_path)
    try:
        first = _report(no_log)
        assert not first.adjoints[0].from_cache and first.adjoints[0].saturation is not None
        again = _report(no_log)  # a new jit: traced again, its adjoint read from the cache
    finally:
        set_cache_dir(None)
    (adjoint,) = again.adjoints
    assert adjoint.from_cache and adjoint.saturation is None and adjoint.e_classes == 0
    text = str(again)
    assert "none built, the adjoint was read from the compile cache" in text
    assert "rules fired" not in text and "e-classes" not in text


# ---------------------------------------------------------------- a stable form in the update


def _loss(w, x):
    return dq.sum(dq.tanh(x @ w))


def _step_with_a_log_of_one_minus_sigmoid(w, x):
    value, g = dq.value_and_grad(_loss)(w, x)
    new_w = w - 0.5 * g
    # what a user writes for a log-probability: log(1 - sigmoid(z)) is -inf in f32 for z > 17
    return value, new_w, dq.log(1 - dq.sigmoid(new_w * -40.0))


def test_an_update_with_a_stable_form_gets_the_algebra(no_ir_cache):
    step = dq.jit(_step_with_a_log_of_one_minus_sigmoid)
    _, new_w, logp = step(W, X)
    report = step.report(W, X)
    assert "second pass skipped" not in report.note  # the module's pass ran on the update
    fired = report.optimize.report[report.name].saturation.rule_matches
    assert fired.get("stable: log(1-sigmoid z)", 0) > 0
    z = new_w.astype(np.float64) * -40.0
    assert np.isfinite(logp).all() and (z > 20).any()  # where the form as written gives -inf
    np.testing.assert_allclose(logp, -np.logaddexp(0.0, z), rtol=1e-5, atol=1e-6)


def test_a_plain_update_still_skips_the_modules_pass(no_ir_cache):
    def step(w, x):
        value, g = dq.value_and_grad(_loss)(w, x)
        return value, w - 0.5 * g, dq.exp(w) * g  # elementwise, no stable form starts here

    f = dq.jit(step)
    f(W, X)
    assert "second pass skipped" in f.report(W, X).note


def test_every_stable_rule_starts_from_a_stable_head():
    """Each rule of rules/algebra.egg's `stable` ruleset matches a term holding an op of
    targets.STABLE_HEADS (so an update without one has nothing for them to make stable), and
    each of those ops is in some stable rule."""
    from dlvm_eq.egraph.serialized import EGG_TO_OP

    text = rule_file("algebra.egg").read_text()
    rules = [r for r in re.split(r"\n(?=\(rule )", text) if ":ruleset stable" in r]
    assert len(rules) >= 6
    seen = set()
    for rule in rules:
        lhs = rule.split("))\n", 1)[0]  # the query: up to the end of its first line's pattern
        ops = {EGG_TO_OP[c] for c in re.findall(r"\((\w+)", lhs) if c in EGG_TO_OP}
        assert ops & targets.STABLE_HEADS, rule
        seen |= ops & targets.STABLE_HEADS
    assert seen == targets.STABLE_HEADS
