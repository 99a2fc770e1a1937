"""rules/algebra.egg's `factor` and `cheap` rulesets: each rewrite on its own (input term ->
expected term, and the guarded ones leave unsafe inputs alone), then programs whose optimized
form holds the cheaper result and computes what the interpreter computes."""

from __future__ import annotations

import numpy as np
import pytest
from test_algebra_rules import K, equal_after

import dlvm_eq as dq
from dlvm_eq.ir import interpret

CASES = [
    ("factor", "(Add (Multiply $x $y) (Multiply $x $A2))", "(Multiply $x (Add $y $A2))"),
    ("factor", "(Add (Multiply $y $x) (Multiply $A2 $x))", "(Multiply (Add $y $A2) $x)"),
    ("factor", "(Add (Multiply $x $y) (Multiply $A2 $x))", "(Multiply $x (Add $y $A2))"),
    ("factor", "(Subtract (Multiply $x $y) (Multiply $x $A2))", "(Multiply $x (Subtract $y $A2))"),
    ("cheap", f"(Power $x {K(3.0)})", "(Multiply (Multiply $x $x) $x)"),
    ("cheap", f"(Divide $x {K(4.0)})", f"(Multiply $x {K(0.25)})"),
    ("cheap", f"(Divide $x {K(-0.125)})", f"(Multiply $x {K(-8.0)})"),
]
A2 = "(Exp $y)"  # a third (2, 3) operand


@pytest.mark.parametrize("ruleset,term,expected", CASES, ids=[f"{r}:{t[:40]}" for r, t, _ in CASES])
def test_rewrites(ruleset, term, expected):
    assert equal_after(term.replace("$A2", A2), expected.replace("$A2", A2), [ruleset])


@pytest.mark.parametrize("c", [10.0, 3.0, 0.1, 6.0])
def test_division_by_a_constant_without_an_exact_reciprocal_stays(c):
    assert not equal_after(f"(Divide $x {K(c)})", f"(Multiply $x {K(1.0 / c)})", ["cheap"])


def _variance_terms(dtype: str) -> tuple[str, str]:
    """sum((x - mean x)^2) along axis 0 of x (2, 3), and its one-pass form."""
    n = f'(Broadcast (Const 2.0 "{dtype}") (vec-of 3))'
    s = '(Reduce $x "add" 0.0 0)'
    d = f"(Subtract $x (Broadcast (Divide {s} {n}) (vec-of 2 3)))"
    return (
        f'(Reduce (Multiply {d} {d}) "add" 0.0 0)',
        f'(Subtract (Reduce (Multiply $x $x) "add" 0.0 0) (Divide (Multiply {s} {s}) {n}))',
    )


def test_one_pass_variance_in_f64_only():
    assert equal_after(*_variance_terms("f64"), ["cheap"], dtype="f64")
    assert not equal_after(*_variance_terms("f32"), ["cheap"], dtype="f32")


def _ops(result, name):
    return [ins.op for ins in result.module[name].body]


def test_cube_and_power_of_two_division_programs():
    def f(x):
        return x**3 + x / 4.0

    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    m = dq.make_ir(f)(x)
    r = dq.optimize(m)
    ops = _ops(r, "f")
    assert "power" not in ops and "divide" not in ops, r.module
    np.testing.assert_allclose(interpret(r.module, "f", x), interpret(m, "f", x), rtol=1e-6)


def test_common_factor_program_saves_a_product():
    def f(a, b, c):
        return a * b + a * c

    rng = np.random.default_rng(1)
    args = [rng.standard_normal((64, 32)) for _ in range(3)]
    m = dq.make_ir(f)(*args)
    r = dq.optimize(m, never_slower=False)  # the rule's effect, not the guard's choice
    assert _ops(r, "f").count("multiply") == 1, r.module
    np.testing.assert_allclose(
        interpret(r.module, "f", *args), interpret(m, "f", *args), rtol=1e-12
    )
