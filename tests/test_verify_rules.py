"""verify_rules: true identities pass, false and shape-unsound rules are reported with file:line
and a counterexample, unknown vocabulary is skipped (and counted), the shipped rules pass."""

from pathlib import Path

import pytest

from dlvm_eq.egraph.rulefiles import rules_dir
from dlvm_eq.egraph.session import RuleFileError
from dlvm_eq.verify import VerificationError, verify_rules
from dlvm_eq.verify.rules import FAILED, SKIPPED, Settings

DATA = Path(__file__).parent / "data" / "rules"


def _by_line(report):
    return {int(r.where.rsplit(":", 1)[1]): r for r in report.results}


def test_true_identities_pass():
    report = verify_rules(DATA / "identities.egg")
    assert report.ok_strict, report.render(verbose=True)
    assert len(report.results) == 21  # the birewrite counts twice
    assert all(r.assignments > 0 for r in report.results)
    # shapes really vary: the transpose-of-dot rule ran on several matrix shapes
    dot_t = next(r for r in report.results if "(Transpose (Dot a b)" in r.text)
    assert dot_t.assignments >= 9


def test_false_identity_is_reported_with_a_counterexample():
    report = verify_rules(DATA / "false_identity.egg")
    assert not report.ok
    (bad,) = report.failed
    assert bad.where == f"{DATA / 'false_identity.egg'}:5"
    assert "Exp (Add a b)" in bad.text
    assert "counterexample" in bad.detail and "left" in bad.detail and "right" in bad.detail
    text = str(report)
    assert "false_identity.egg:5: FAILED" in text and "1 failed" in text
    assert _by_line(report)[3].status == "proven"


def test_shape_unsound_rule_is_reported():
    report = verify_rules(DATA / "shape_unsound.egg")
    (bad,) = report.failed
    assert bad.where.endswith("shape_unsound.egg:2")
    assert "different types" in bad.detail
    assert "f32" in bad.detail and "x:" in bad.detail  # the types and the shape assignment


def test_domain_guards_are_required():
    report = verify_rules(DATA / "unguarded.egg")
    exp_log, div = report.results
    assert exp_log.status == FAILED and "positive" in exp_log.detail
    assert div.status == FAILED and "nonzero" in div.detail  # x = 0 is a special point


def test_wrong_adjoint_rule_is_reported():
    report = verify_rules(DATA / "adjoint_wrong.egg")
    (bad,) = report.failed
    assert "Adjoint 0 (Tanh x)" in bad.detail and "counterexample" in bad.detail


def test_unknown_vocabulary_is_skipped_and_counted():
    report = verify_rules(DATA / "unknown.egg")
    assert report.ok and not report.ok_strict
    lines = _by_line(report)
    assert lines[4].status == SKIPPED and "mystery" in lines[4].detail
    assert lines[5].status == SKIPPED and "Opaque" in lines[5].detail
    assert lines[7].status == "proven"
    assert lines[6].status == SKIPPED
    assert "3 skipped" in report.summary()
    with pytest.raises(VerificationError, match="skipped"):
        verify_rules(DATA / "unknown.egg", strict=True)


def test_syntax_error_names_the_line():
    with pytest.raises(RuleFileError) as err:
        verify_rules(DATA / "syntax_error.egg")
    assert err.value.filename.endswith("syntax_error.egg")
    assert err.value.line in (3, 4, 5)


def test_text_rules_and_analysis_claims():
    text = """
    (function cval (Term) f64 :merge old)
    (relation positive (Term))
    (rule ((= e (Broadcast a s)) (= v (cval a))) ((set (cval e) v)))
    (rule ((= e (Multiply a z)) (= 0.0 (cval z))) ((union e z)))
    (rule ((= e (Const v d)) (> v 0.0)) ((positive e)))
    (rule ((= e (Add a b)) (= s (shape a))) ((set (shape e) (vec-push s 1))))
    (rule ((= e (Tanh x))) ((positive e)))
    """
    report = verify_rules(text)
    statuses = [r.status for r in report.results]
    assert statuses == ["proven", "proven", "proven", FAILED, FAILED], report.render(True)
    assert "the rule sets" in report.results[3].detail
    assert "not > 0" in report.results[4].detail


# one case per shipped file, so that pytest-xdist spreads them over its workers (together they
# were CI's longest test, 396 s on one worker); a file checked alone sees the shipped files
# before it, as in a run over all of them (verify/rules.load_rule_files)
SHIPPED_FILES = ("schema.egg", "algebra.egg", "adjoint.egg", "fusion.egg", "attention.egg")
SHIPPED_FILES += ("attention_adjoint.egg", "loops.egg", "layout.egg", "per_example.egg")
SHIPPED_FILES += ("merge_adjoint.egg",)


def test_the_thorough_cases_cover_every_shipped_rule_file():
    assert sorted(SHIPPED_FILES) == sorted(p.name for p in _shipped())


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED_FILES)
def test_shipped_rule_files_pass_thoroughly(name):
    """A shipped rule file under the default (thorough) settings, which `dlvm-eq
    verify-rules --strict` uses. The quick settings' pass over every file is
    test_verify_fusion_rules.test_cli_strict_on_every_shipped_rule_file (through the CLI)."""
    report = verify_rules(rules_dir() / name)
    print(report.render())
    assert report.ok_strict, report.render()  # what `dlvm-eq verify-rules --strict` requires
    assert report.ok, "a shipped rule is not an identity:\n" + report.render()
    counted = sum(
        report.count(s)
        for s in (
            "proven",
            "proven a.e.",
            "checked numerically",
            "unproven",
            "definition",
            "nothing to check",
            SKIPPED,
            FAILED,
        )
    )
    assert counted == len(report.results) > 0
    assert [Path(f).name for f in report.files] == [name]
    # every shipped rule has a meaning verify-rules knows: none is skipped
    assert not report.skipped, report.render()
    # a rule sympy cannot prove within its time is allowed but must be visible
    for r in report.unproven + report.numeric_only:
        assert r.detail and r.where in report.render()


def _shipped():
    order = ["schema.egg", "algebra.egg", "adjoint.egg", "fusion.egg"]
    files = sorted(
        rules_dir().glob("*.egg"),
        key=lambda p: (order.index(p.name) if p.name in order else len(order), p.name),
    )
    assert files and files[0].name == "schema.egg"
    return files


def test_a_declared_numeric_lemma_skips_sympy_but_not_the_numeric_check():
    """`;; verify: numeric -- why` above a rule: checked numerically on every assignment,
    sympy not asked; a false rule so marked still fails."""
    text = """
    ;; verify: numeric -- a test of the mark
    (rewrite (Exp (Add a b)) (Multiply (Exp a) (Exp b)))
    ;; verify: numeric
    (rewrite (Exp (Add a b)) (Add (Exp a) (Exp b)))
    (rewrite (Exp (Add b a)) (Multiply (Exp b) (Exp a)))
    """
    marked, wrong, plain = verify_rules(text).results
    assert marked.status == "checked numerically" and marked.symbolic == 0
    assert "declared numeric-only (a test of the mark)" in marked.detail
    assert wrong.status == FAILED and "counterexample" in wrong.detail
    assert plain.status == "proven" and plain.symbolic > 0


def test_a_rule_sympy_runs_out_of_time_on_is_checked_numerically_not_proven():
    # no time for sympy at all: what a loaded machine can make of any rule. Strict accepts it
    # (the verdict must not depend on the load) and says it was only checked numerically
    report = verify_rules(
        DATA / "identities.egg", settings=Settings(symbolic_seconds=0.0), strict=True
    )
    numeric = report.numeric_only
    assert numeric and report.ok_strict
    assert all(r.status == "checked numerically" and r.symbolic == 0 for r in numeric)
    assert "agree numerically" in numeric[0].detail
    assert "checked numerically" in report.render() and numeric[0].where in report.render()
    assert f"{len(numeric)} checked numerically" in report.summary()
    # the numeric check still runs first: a false rule fails however little time sympy has
    bad = verify_rules(DATA / "false_identity.egg", settings=Settings(symbolic_seconds=0.0))
    assert [r.status for r in bad.results].count(FAILED) == 1
