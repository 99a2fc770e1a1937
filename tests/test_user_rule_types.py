"""An ill-typed user rule never gives a program: every e-node is type-checked before extraction
reads it (egraph/rule_origin.check_terms), and the command stops with the rule's file:line.

Each rule below printed a wrong program with exit 0 before (softplus.dl computes 2x): zeros
(Dot of two 4x3 matrices, whose shapes the analysis does not check, made softplus(x) and
softplus(-x) equal, so their difference folded to 0), `x`, and a reduction added where the
term was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.cli import main
from dlvm_eq.egraph.rule_origin import UserRuleError
from dlvm_eq.ir.interp import interpret
from dlvm_eq.ir.parser import load

ROOT = Path(__file__).resolve().parents[1]
SOFTPLUS = ROOT / "examples" / "softplus.dl"

ILL_TYPED = {
    # gave zeros: Dot of <4 x 3> and <4 x 3>
    "dot": ("(rewrite (Softplus x) (Dot x x))", "Dot"),
    # gave `x`: a scalar where a 4x3 tensor was
    "scalar": ('(rewrite (Softplus x) (Const 0.0 "f32"))', "two types"),
    # gave softplus(x) + softplus(x): a <3> reduction where a <4 x 3> tensor was
    "reduce": ('(rewrite (Softplus x) (Reduce x "add" 0.0 0))', "two types"),
    # extracted the right program by luck of the costs, but the e-graph held a wrong class
    "transpose": ("(rewrite (Softplus x) (Transpose x (vec-of 1 0)))", "two types"),
    # a ValueError traceback from the cost model's types (found by the fuzzer, seed 2)
    "dtype": ('(rewrite (Softplus x) (Broadcast (Const 1.0 "f16") (vec-of 4 3)))', "DType"),
    "var": ('(rewrite (Softplus x) (Var "nope"))', "not a value of the program"),
}


def _rules(tmp_path, text: str) -> Path:
    p = tmp_path / "mine.egg"
    p.write_text(f"(ruleset mine)\n;; an ill-typed rule\n{text[:-1]} :ruleset mine)\n")
    return p


@pytest.mark.parametrize("case", sorted(ILL_TYPED))
def test_opt_stops_at_an_ill_typed_rule(capsys, tmp_path, case):
    rule, says = ILL_TYPED[case]
    rules = _rules(tmp_path, rule)
    code = main(["opt", str(SOFTPLUS), "--rules", str(rules)])
    out, err = capsys.readouterr()
    assert (code, out) == (1, ""), out  # exit 0 with a wrong program before
    # the rule as written, cut at 70 characters
    assert err.startswith(f"dlvm-eq: error: {rules}:3: the rule {rule[:-1][:40]}")
    assert says in err and f"dlvm-eq verify-rules {rules}" in err


@pytest.mark.parametrize("case", ["dot", "scalar"])
def test_the_api_path_stops_too(tmp_path, case):
    rules = _rules(tmp_path, ILL_TYPED[case][0])
    with pytest.raises(UserRuleError, match=f"{rules}:3: the rule"):
        dq.optimize(load(SOFTPLUS), rules=[rules])


def test_query_stops_too(capsys, tmp_path):
    rules = _rules(tmp_path, ILL_TYPED["dot"][0])
    code = main(["query", "softplus(x) - softplus(-x)", "--shape", "x=4x3", "--rules", str(rules)])
    _, err = capsys.readouterr()
    assert code == 1 and f"{rules}:3: the rule" in err


def test_a_well_typed_user_rule_still_optimizes_and_is_right(tmp_path):
    rules = ROOT / "examples" / "rules" / "softplus.egg"
    m = load(SOFTPLUS)
    r = dq.optimize(m, rules=[rules], never_slower=False)  # the rule's result, not the guard's
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    assert [i.op for i in r.module["f"].body] == ["multiply"]  # softplus(x) - softplus(-x) = x
    np.testing.assert_allclose(
        interpret(r.module, "f", x), interpret(m, "f", x, float64=True), rtol=1e-6
    )


def test_the_guilty_rule_is_named_among_others_that_fired(capsys, tmp_path):
    rules = tmp_path / "two.egg"
    rules.write_text(
        "(ruleset mine)\n"
        "(rewrite (Negate (Negate x)) x :ruleset mine)\n"
        "(rewrite (Softplus x) (Softplus (Negate (Negate x))) :ruleset mine)\n"
        "(rewrite (Softplus x) (Dot x x) :ruleset mine)\n"
    )
    code = main(["opt", str(SOFTPLUS), "--rules", str(rules)])
    _, err = capsys.readouterr()
    assert code == 1
    # the rules that fired and build no Dot are left out
    assert f"{rules}:4: the rule (rewrite (Softplus x) (Dot x x)" in err
    assert f"{rules}:2" not in err and f"{rules}:3" not in err


def test_an_ill_typed_node_a_shipped_rule_subsumed_is_still_seen(capsys, tmp_path):
    # found by the fuzzer (seed 1, case 120): the Dot nodes of <4 x 3> operands were subsumed
    # by shipped rules (dot-0, 0*x) after they had made x = -x = 0, one class of well-typed
    # nodes; opt printed `return %x` for 2x
    rules = tmp_path / "subsumed.egg"
    rules.write_text(
        "(ruleset fuzz)\n"
        '(rule ((= e (Multiply a a))) ((union e (Square a))) :ruleset fuzz :name "fuzz x*x")\n'
        "(rule ((= e (ShapeCast a s)) (= s (shape a))) ((union e (Broadcast e (vec-of 7 7 7)))"
        ' (subsume (ShapeCast a s))) :ruleset fuzz :name "fuzz shapecast-same")\n'
        "(rewrite (Subtract (Softplus x) (Softplus (Negate x))) x :ruleset fuzz)\n"
        "(rewrite (Softplus x) (Dot x x) :ruleset fuzz)\n"
    )
    code = main(["opt", str(SOFTPLUS), "--rules", str(rules)])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert f"{rules}:5: the rule (rewrite (Softplus x) (Dot x x)" in err


def test_a_user_rule_cannot_delete_what_it_made(capsys, tmp_path):
    rules = tmp_path / "delete.egg"
    rules.write_text(
        "(ruleset mine)\n"
        "(rule ((= e (Softplus x))) ((union e (Dot x x)) (delete (Dot x x))) :ruleset mine)\n"
    )
    code = main(["opt", str(SOFTPLUS), "--rules", str(rules)])
    _, err = capsys.readouterr()
    assert code == 1 and err.startswith(f"{rules}:2:49: error: a user's rule cannot `delete`")
