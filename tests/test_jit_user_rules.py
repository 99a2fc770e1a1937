"""A user's rule files reach dq.jit and dq.compile: their rulesets join the shipped ones, the
report names the user's rules that fired, and the files' contents are part of the cache keys."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.errors import DlvmError

IDENTITY = (
    "(ruleset mine)\n"
    ";; softplus(x) - softplus(-x) = x\n"
    "(rewrite (Subtract (Softplus x) (Softplus (Negate x))) x :ruleset mine)\n"
)
UNRELATED = "(ruleset mine)\n(rewrite (Cosh (Negate x)) (Cosh x) :ruleset mine)\n"
X = np.linspace(-2, 2, 12).reshape(3, 4).astype(np.float32)


def f(x):
    return (dq.softplus(x) - dq.softplus(-x)) * 2.0


def test_a_jitted_function_uses_the_users_rules(tmp_path):
    rules = tmp_path / "mine.egg"
    rules.write_text(IDENTITY)
    mine = dq.jit(f, rules=[rules])
    np.testing.assert_allclose(mine(X), 2 * X, rtol=1e-5, atol=1e-6)
    report = mine.report(X)
    fr = report.optimize.report[report.name]
    assert [(file, line) for file, line, _, _ in fr.user_rules] == [(str(rules), 3)]
    assert fr.user_rules[0][3] >= 1  # matches (egglog may match it again in later rounds)
    assert f"your rules fired: {rules}:3" in str(report)
    assert not any(i.op == "softplus" for i in fr_module(report).body)
    plain = dq.jit(f).report(X)  # the next compile, without them
    assert "your rules" not in str(plain)
    assert any(i.op == "softplus" for i in fr_module(plain).body)


def fr_module(report):
    return report.optimize.module[report.name]


def test_the_rule_files_contents_are_part_of_the_cache_key(tmp_path):
    rules = tmp_path / "mine.egg"
    rules.write_text(IDENTITY)
    g = lambda x: (dq.softplus(x) - dq.softplus(-x)) * 3.0
    first = dq.jit(g, rules=[rules]).lower(X)
    compiled = dq.compile(first, next(iter(first.functions)), rules=[rules])
    assert not any(i.op == "softplus" for i in fr_module(compiled.report).body)
    rules.write_text(UNRELATED)  # same path, other rules: not the entry the first made
    again = dq.compile(first, next(iter(first.functions)), rules=[rules])
    assert again.report.optimize is not None  # optimized again, not read from the cache
    assert any(i.op == "softplus" for i in fr_module(again.report).body)
    np.testing.assert_allclose(again(X), 3 * X, rtol=1e-5, atol=1e-6)


def test_rules_need_a_target_that_optimizes(tmp_path):
    rules = tmp_path / "mine.egg"
    rules.write_text(IDENTITY)
    with pytest.raises(DlvmError, match="rules= needs a target that optimizes"):
        dq.jit(f, target="interp", rules=[rules])(X)


def test_a_pickled_jitted_function_keeps_its_rules(tmp_path):
    rules = tmp_path / "mine.egg"
    rules.write_text(IDENTITY)
    back = pickle.loads(pickle.dumps(dq.jit(f, rules=[rules])))
    assert back.rules == (rules,)
    np.testing.assert_allclose(back(X), 2 * X, rtol=1e-5, atol=1e-6)


def test_the_users_rules_reach_a_loop_body(tmp_path):
    rules = tmp_path / "mine.egg"
    rules.write_text(IDENTITY)

    def loop(x):
        def body(c, _):
            return (dq.softplus(c) - dq.softplus(-c)) * 0.5 + c, None

        return dq.scan(body, x, length=3)[0]

    got = dq.jit(loop, rules=[rules])(X)
    np.testing.assert_allclose(got, X * 1.5**3, rtol=1e-5, atol=1e-6)
    report = str(dq.jit(loop, rules=[rules]).report(X))
    assert f"your rules fired: {rules}:3" in report
    assert "your rules" not in str(dq.jit(loop).report(X))
