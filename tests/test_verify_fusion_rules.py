"""verify-rules on rules/fusion.egg: the scalar sub-language has a meaning (Load and Map are the
identity on values, S<op> is the op, S<view> the view, ReduceMap a Reduce), so every fusion
rule is proven, and a wrong fusion rule is reported FAILED with a counterexample."""

from __future__ import annotations

import re

from dlvm_eq.cli import main
from dlvm_eq.egraph.fusion_rules import fusion_rules_text, scalar_ops
from dlvm_eq.egraph.rulefiles import SHIPPED, rule_file
from dlvm_eq.ir.ops import OPS
from dlvm_eq.verify import verify_rules
from dlvm_eq.verify.pattern import Vocab
from dlvm_eq.verify.rules import FAILED, SKIPPED, Settings, load_rule_files
from dlvm_eq.verify.search import Space

QUICK = Settings(space=Space(limit=48), symbolic_seconds=5.0)


def _declarations() -> str:
    """rules/fusion.egg without its rules: the Scalar datatype, Map and ReduceMap."""
    text = fusion_rules_text()
    return text[: text.index("(ruleset fusion)")]


def _rule_file(tmp_path, rules: str):
    path = tmp_path / "fusion_test.egg"
    path.write_text(_declarations() + "(ruleset wrong)\n" + rules)
    first = path.read_text().splitlines().index(rules.splitlines()[0]) + 1
    return path, first


def test_every_scalar_form_means_its_ir_op():
    _, vocab, _ = load_rule_files([rule_file("fusion.egg")])
    assert isinstance(vocab, Vocab)
    for name, ctor, _ in scalar_ops():
        assert vocab.ir_ctor(ctor) == OPS[name].egg, ctor
        assert vocab.meaning(ctor) is None
    for helper in ("Load", "Map", "ReduceMap"):
        assert vocab.meaning(helper) is None and vocab.helper(helper) is not None
    assert vocab.term_sorts() == {"Term", "Scalar"}


def test_every_fusion_rule_is_proven():
    report = verify_rules([rule_file("schema.egg"), rule_file("fusion.egg")], settings=QUICK)
    fusion = [r for r in report.results if r.where.startswith(str(rule_file("fusion.egg")))]
    n_rules = len(re.findall(r"^\(rewrite ", rule_file("fusion.egg").read_text(), re.MULTILINE))
    assert len(fusion) == n_rules >= 52  # one per elementwise op and view (52: stopGradient, bits)
    assert report.ok_strict, report.render()
    for r in fusion:
        assert r.status == "proven", r.render()
        assert r.assignments > 0 and r.symbolic == r.assignments, r.render()
    by_text = {" ".join(r.text.split()): r for r in fusion}
    # views and the reduction ran over many shapes and attributes, not one
    assert (
        by_text[
            "(rewrite (Load (Broadcast t p1)) (SBroadcast (Load t) p1) :ruleset fusion)"
        ].assignments
        >= 20
    )
    assert (
        by_text[
            "(rewrite (Reduce x c i k) (ReduceMap (Load x) c i (vec-of k)) :ruleset fusion)"
        ].assignments
        >= 20
    )


def test_wrong_fusion_rules_fail(tmp_path):
    wrong = [
        "(rewrite (Add a b) (Map (SMultiply (Load a) (Load b))) :ruleset wrong)",
        "(rewrite (Load (Transpose t p)) (Load t) :ruleset wrong)",
        "(rewrite (Reduce x c i k) (ReduceMap (Load x) c 0.0 (vec-of k)) :ruleset wrong)",
        "(rewrite (Exp x) (Map (SExp (Load (Negate x)))) :ruleset wrong)",
        "(rewrite (Load (Map (SSubtract s u))) (SSubtract u s) :ruleset wrong)",
    ]
    right = [
        "(rewrite (Load (Broadcast t s)) (SBroadcast (Load t) s) :ruleset wrong)",
        "(rewrite (Load (Map (SAdd s u))) (SAdd u s) :ruleset wrong)",
    ]
    path, first = _rule_file(tmp_path, "".join(line + "\n" for line in wrong + right))
    report = verify_rules(path, settings=QUICK)
    statuses = [r.status for r in report.results]
    assert statuses == [FAILED] * 5 + ["proven"] * 2, report.render(verbose=True)
    bad = report.results[0]
    assert bad.where == f"{path}:{first}"
    assert "SMultiply" in bad.detail and "counterexample" in bad.detail
    transpose = report.results[1].detail
    assert "different types" in transpose or "counterexample" in transpose
    assert "counterexample" in report.results[2].detail  # e.g. add from init -1, not 0
    assert not report.ok


def test_a_misdeclared_scalar_form_is_skipped_with_the_reason():
    text = """
    (datatype Scalar (Load Term) (SExp Scalar Scalar))
    (constructor Map (Scalar) Term)
    (rewrite (Exp x) (Map (SExp (Load x) (Load x))))
    """
    (r,) = verify_rules(text).results
    assert r.status == SKIPPED
    assert "SExp is declared (Scalar Scalar)" in r.detail and "(Scalar)" in r.detail


def test_cli_strict_on_every_shipped_rule_file(capsys):
    """`dlvm-eq verify-rules` without files checks the shipped ones, fusion.egg included."""
    code = main(["verify-rules", "--strict", "--quick"])
    out, _ = capsys.readouterr()
    assert code == 0, out
    assert "0 skipped" in out and "0 failed" in out
    for name in SHIPPED:
        assert any("rules in" in line and name in line for line in out.splitlines()), name
