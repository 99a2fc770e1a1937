"""`dq.jit(f, rules=[...], verify_rules=True)` and `dq.compile(..., verify_rules=True)`: a user
rule that verify-rules cannot prove is refused before anything compiles, with its file:line;
proven rules compile as without the flag. The oracle of "false" is numpy: the same false rule
without the flag changes the compiled result."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.errors import DlvmError
from dlvm_eq.verify import VerificationError

IDENTITY = (
    "(ruleset mine)\n"
    ";; softplus(x) - softplus(-x) = x\n"
    "(rewrite (Subtract (Softplus x) (Softplus (Negate x))) x :ruleset mine)\n"
)
# false (tanh is not the identity), and cheaper: extraction takes it when it may
FALSE = (
    "(ruleset mine)\n"
    "(rewrite (Cosh (Negate x)) (Cosh x) :ruleset mine)\n"
    "(rewrite (Tanh x) x :ruleset mine)\n"
)
X = np.linspace(-2, 2, 12).reshape(3, 4).astype(np.float32)
W = np.linspace(-1, 1, 20).reshape(4, 5).astype(np.float32)


def softplus_difference(x):
    return (dq.softplus(x) - dq.softplus(-x)) * 2.0


def tanh_twice(x):
    return dq.tanh(x) * 2.0


def tanh_then_product(x, w):
    # the false rule removes a whole kernel here, a predicted gain far above the never-slower
    # guard's error (pipeline/never_slower.py), so without the flag it is taken
    return dq.tanh(x) @ w


def test_a_false_rule_is_refused_with_its_file_and_line(tmp_path):
    rules = tmp_path / "false.egg"
    rules.write_text(FALSE)
    # without the flag the false rule is used: the result is wrong, as numpy says
    unchecked = dq.jit(tanh_then_product, rules=[rules])(X, W)
    assert not np.allclose(unchecked, np.tanh(X) @ W, atol=1e-3)
    with pytest.raises(VerificationError) as info:
        dq.jit(tanh_twice, rules=[rules], verify_rules=True)
    message = str(info.value)
    assert f"{rules}:3" in message and "FAILED" in message and "(Tanh x)" in message
    assert f"{rules}:2" not in message  # the true rule of the same file is not named


def test_proven_rules_compile_as_without_the_flag(tmp_path):
    rules = tmp_path / "mine.egg"
    rules.write_text(IDENTITY)
    checked = dq.jit(softplus_difference, rules=rules, verify_rules=True)
    np.testing.assert_allclose(checked(X), 2 * X, rtol=1e-5, atol=1e-6)
    assert f"your rules fired: {rules}:3" in str(checked.report(X))


def test_each_file_is_checked_once_per_text(tmp_path, monkeypatch):
    from dlvm_eq.verify import rules as verify_module

    calls = []
    real = verify_module.verify_rules
    monkeypatch.setattr(
        verify_module, "verify_rules", lambda files: calls.append(files) or real(files)
    )
    rules = tmp_path / "mine.egg"
    rules.write_text(IDENTITY)
    dq.jit(softplus_difference, rules=[rules], verify_rules=True)
    dq.jit(tanh_twice, rules=[rules], verify_rules=True)
    assert len(calls) == 1
    rules.write_text(FALSE)  # the same path, edited: checked again, and refused
    with pytest.raises(VerificationError, match="FAILED"):
        dq.jit(softplus_difference, rules=[rules], verify_rules=True)
    assert len(calls) == 2


def test_compile_refuses_a_false_rule(tmp_path):
    rules = tmp_path / "false.egg"
    rules.write_text(FALSE)
    module = dq.jit(tanh_twice).lower(X)
    name = next(iter(module.functions))
    with pytest.raises(VerificationError, match=f"{rules}:3"):
        dq.compile(module, name, rules=[rules], verify_rules=True, cast=True)


def test_a_missing_rule_file_is_a_located_error(tmp_path):
    with pytest.raises(DlvmError, match="no such rule file"):
        dq.jit(tanh_twice, rules=[tmp_path / "absent.egg"], verify_rules=True)


def test_a_pickled_jitted_function_keeps_the_flag(tmp_path):
    rules = tmp_path / "mine.egg"
    rules.write_text(IDENTITY)
    back = pickle.loads(pickle.dumps(dq.jit(softplus_difference, rules=[rules], verify_rules=True)))
    assert back.verify_rules and back.rules == (rules,)
    np.testing.assert_allclose(back(X), 2 * X, rtol=1e-5, atol=1e-6)


def test_optimize_refuses_a_false_rule_and_keeps_a_proven_one(tmp_path):
    false, mine = tmp_path / "false.egg", tmp_path / "mine.egg"
    false.write_text(FALSE)
    mine.write_text(IDENTITY)
    module = dq.jit(tanh_then_product).lower(X, W)
    name = next(iter(module.functions))
    # without the flag the false rule is used: the interpreted result is wrong, as numpy says
    unchecked = dq.optimize(module, name, rules=[false]).module
    assert not np.allclose(dq.interpret(unchecked, name, X, W), np.tanh(X) @ W, atol=1e-3)
    with pytest.raises(VerificationError) as info:
        dq.optimize(module, name, rules=[false], verify_rules=True)
    assert f"{false}:3" in str(info.value) and f"{false}:2" not in str(info.value)
    with pytest.raises(VerificationError, match=f"{false}:3"):  # rules given by position
        dq.optimize(module, name, [false], verify_rules=True)
    sp = dq.jit(softplus_difference).lower(X)
    sp_name = next(iter(sp.functions))
    checked = dq.optimize(sp, sp_name, rules=mine, verify_rules=True).module
    np.testing.assert_allclose(dq.interpret(checked, sp_name, X), 2 * X, rtol=1e-5, atol=1e-6)
