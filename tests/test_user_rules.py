"""A user's rule file, checked as users write them: verify-rules knows the shipped relations
(the rules guide's guarded rule, docs/guide/rules.md, verifies alone), a wrong rule fails with
a counterexample, a rule that makes an ill-typed term is named (file:line) by opt and query,
and an unclosed paren is reported where it is."""

import textwrap

import pytest

from dlvm_eq.cli import main


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _file(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip())
    return p


PROGRAM = """
    module "m"
    stage raw
    func @f: (<2 x 3 x f32>, <2 x 3 x f32>) -> <2 x 3 x f32> {
    'entry(%x: <2 x 3 x f32>, %y: <2 x 3 x f32>):
        %0 = add %x: <2 x 3 x f32>, %y: <2 x 3 x f32>
        %1 = exp %0: <2 x 3 x f32>
        return %1: <2 x 3 x f32>
    }
"""


def test_a_guarded_user_rule_verifies_alone(capsys, tmp_path):
    # the rules guide's form: a sign guard through algebra.egg's `positive` relation
    rules = _file(
        tmp_path,
        "mine.egg",
        """
        (ruleset mine)
        (rule ((= e (Sqrt (Multiply a a))) (positive a)) ((union e a)) :ruleset mine :name "sqrt-square")
        (rule ((= e (Divide (Multiply a b) b)) (nonzero b)) ((union e a)) :ruleset mine :name "cancel")
    """,
    )
    code, out, err = cli(capsys, "verify-rules", rules, "--strict")
    assert (code, err) == (0, ""), out + err
    assert "2 rules" in out and "0 failed" in out and "0 skipped" in out
    # and the same file is accepted by opt (it always was)
    dl = _file(tmp_path, "f.dl", PROGRAM)
    code, _, err = cli(capsys, "opt", dl, "--rules", rules)
    assert code == 0, err


def test_the_same_rule_without_its_guard_fails_with_a_counterexample(capsys, tmp_path):
    rules = _file(
        tmp_path,
        "wrong.egg",
        """
        (ruleset mine)
        ;; wrong for negative a
        (rule ((= e (Sqrt (Multiply a a)))) ((union e a)) :ruleset mine :name "sqrt-square")
    """,
    )
    code, out, _ = cli(capsys, "verify-rules", rules)
    assert code == 1
    assert f"{rules}:3 [sqrt-square]: FAILED" in out
    assert "counterexample" in out and "a = -" in out


def test_an_ill_typed_user_rule_is_named_by_opt_and_query(capsys, tmp_path):
    rules = _file(
        tmp_path,
        "bad.egg",
        """
        (ruleset mine)

        (rewrite (Exp x) (ShapeCast x (vec-of 6 6)) :ruleset mine)
    """,
    )
    dl = _file(tmp_path, "f.dl", PROGRAM)
    code, _, err = cli(capsys, "opt", dl, "--rules", rules)
    assert code == 1
    assert f"{rules}:3: the rule (rewrite (Exp x) (ShapeCast x (vec-of 6 6))" in err
    assert "cannot cast" in err and f"dlvm-eq verify-rules {rules}" in err
    code, _, err = cli(capsys, "query", "exp(x)", "--shape", "x=2x3", "--rules", rules)
    assert code == 1
    assert f"{rules}:3: the rule" in err and "verify-rules" in err


@pytest.mark.parametrize("command", ["verify-rules", "opt"])
def test_an_unclosed_paren_is_reported_where_it_is(capsys, tmp_path, command):
    rules = _file(
        tmp_path,
        "open.egg",
        """
        (ruleset mine)
        ; a comment with a ( paren
        (rewrite (Exp (Log x) x :ruleset mine)
        (rewrite (Negate (Negate x)) x :ruleset mine)
    """,
    )
    argv = (
        [command, rules]
        if command == "verify-rules"
        else [command, _file(tmp_path, "f.dl", PROGRAM), "--rules", rules]
    )
    code, _, err = cli(capsys, *argv)
    assert code == 1
    first = err.splitlines()[0]
    assert (
        first
        == f"{rules}:3:1: error: this '(' is never closed (no matching ')' before the end of the file)"
    )
    assert "(rewrite (Exp (Log x) x :ruleset mine)" in err


def test_unclosed_paren_scanner():
    from dlvm_eq.egraph.session import unclosed_paren

    assert unclosed_paren("(a (b)\n(c)") == (1, 1)
    assert unclosed_paren('(a ")" ; )\n') == (1, 1)  # a ')' in a string or a comment
    assert unclosed_paren("(a)\n  (b (c)") == (2, 3)
    assert unclosed_paren('(a "(" ; (\n)') is None
