"""rules/algebra.egg's `merge` ruleset (TASO): products sharing an operand become slices of
one product of concatenated weights. It fires on an attention block's projections; the merged
program, extracted and compiled, computes what the interpreter computes."""

from __future__ import annotations

import numpy as np
import pytest
from test_algebra_rules import _decls

import dlvm_eq as dq
from dlvm_eq.egraph import RuleFileError
from dlvm_eq.egraph.optimize import scratch_session
from dlvm_eq.egraph.ruleset_schedule import Budget, Schedule
from dlvm_eq.egraph.saturate import saturate
from dlvm_eq.extract import target_cost
from dlvm_eq.ir import interpret


def _slices(w: str, axis: int, cuts) -> list[str]:
    return [f"(Slice {w} {axis} {lo} {hi})" for lo, hi in zip(cuts, cuts[1:])]


def merged(products: list[str], expected: list[str]) -> bool:
    """Whether, with all `products` in one e-graph (and a third weight G (6, 4)), each equals
    its expected term after the merge ruleset."""
    with scratch_session() as s:
        s.run_text(
            _decls()
            + '(let $G (Var "G")) (set (shape $G) (vec-of 6 4)) (set (dtype $G) "f32")\n'
            + "".join(f"(let $p{i} {p})\n" for i, p in enumerate(products))
        )
        saturate(s, Schedule(("merge",)), Budget(iterations=4))
        try:
            for i, e in enumerate(expected):
                s.run_text(f"(check (= $p{i} {e}))")
            return True
        except RuleFileError:
            return False


def test_two_products_sharing_x_are_slices_of_one():
    # X (7, 6) times the weights V (6, 2) and C (6, 3)
    assert merged(
        ["(Dot $X $V)", "(Dot $X $C)"], _slices("(Dot $X (Concatenate $V $C 1))", 1, (0, 2, 5))
    )


def test_three_products_sharing_x_are_slices_of_one():
    assert merged(
        ["(Dot $X $V)", "(Dot $X $C)", "(Dot $X $G)"],
        _slices("(Dot $X (Concatenate (Concatenate $V $C 1) $G 1))", 1, (0, 2, 5, 9)),
    )


def test_products_sharing_dy_are_row_slices_of_one():
    # A (4, 5) and E (4, 5) times B (5, 6)
    assert merged(
        ["(Dot $A $B)", "(Dot $E $B)"], _slices("(Dot (Concatenate $A $E 0) $B)", 0, (0, 4, 8))
    )


def test_intermediates_are_not_merged():
    """Only parameters: a merged product (not a parameter) never merges again."""
    assert merged(
        ["(Dot $X $V)", "(Dot $X $C)"], _slices("(Dot $X (Concatenate $V $C 1))", 1, (0, 2, 5))
    )
    assert not merged(
        ["(Dot $X (Exp $V))", "(Dot $X (Exp $C))"],
        _slices("(Dot $X (Concatenate (Exp $V) (Exp $C) 1))", 1, (0, 2, 5)),
    )


def attention(x, wq, wk, wv):
    q, k, v = x @ wq, x @ wk, x @ wv
    s = dq.softmax((q @ k.T) * 0.25)
    return s @ v


@pytest.fixture
def args():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    return [x] + [(rng.standard_normal((16, n)) * 0.3).astype(np.float32) for n in (16, 16, 12)]


def test_merge_fires_on_attention_projections(args):
    m = dq.make_ir(attention)(*args)
    fr = dq.optimize(m, budget={"seconds": 20.0}).report["attention"]
    assert fr.saturation.rule_matches.get("merge: xA,xB,xC", 0) >= 1, str(fr)


def test_merged_attention_compiles_and_agrees_with_the_interpreter(args, monkeypatch):
    """At these tiny sizes the cost model keeps three products (the weights' copy costs what the
    calls it saves do: test_merge_extraction.py has the sizes where it merges); with the
    concatenation priced free here, extraction takes the merged form, and the compiled merged
    program must agree."""
    term_cost = target_cost.TargetCost.term_cost

    def views_free(self, op, t, child, *rest):  # rest: Gemm's flags, a Transpose's axes
        if op in ("Slice", "Concatenate"):
            return 0.0
        return term_cost(self, op, t, child, *rest)

    m = dq.make_ir(attention)(*args)
    monkeypatch.setattr(target_cost.TargetCost, "term_cost", views_free)
    monkeypatch.setattr(
        target_cost.TargetCost, "concatenation_seconds", lambda self, t, nested=None: 0.0
    )
    merged = dq.optimize(m, budget={"seconds": 20.0}, never_slower=False).module
    monkeypatch.undo()
    fn = merged["attention"]
    ops = [ins.op for ins in fn.body]
    dots_of_x = [
        ins for ins in fn.body if ins.op == "dot" and getattr(ins.operands[0], "name", "") == "x"
    ]
    # at least two projections share one product of x (which ones is the extractor's choice)
    assert "concatenate" in ops and ops.count("slice") >= 2 and len(dots_of_x) <= 2, fn
    want = interpret(m, "attention", *args, float64=True)
    np.testing.assert_allclose(interpret(merged, "attention", *args, float64=True), want, rtol=1e-9)
    got = dq.compile(merged, "attention", optimize=False)(*args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
