"""rules/layout.egg: each rule fires where it should (an input term becomes equal to the
expected term) and leaves alone what it must not touch (the guards). The rules themselves are
proved by `dlvm-eq verify-rules` (tests/test_verify_rules.py runs it over the shipped files)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from test_algebra_rules import K, equal_after

import dlvm_eq as dq

T2 = "(vec-of 1 0)"
P3 = "(vec-of 0 2 1)"  # the last two axes of a rank-3 tensor swapped, the batch axis kept
LAYOUT = ("layout", "transpose", "identities")

FIRES = [
    ("T-sin", f"(Sin (Transpose $A {T2}))", f"(Transpose (Sin $A) {T2})"),
    ("T-erf", f"(Erf (Transpose $T {P3}))", f"(Transpose (Erf $T) {P3})"),
    (
        "T-pow",
        f"(Power (Transpose $A {T2}) (Transpose $M {T2}))",
        f"(Transpose (Power $A $M) {T2})",
    ),
    (
        "T-select",
        f"(Select (Transpose $A {T2}) (Transpose $M {T2}) (Transpose (GreaterThan $A $M) {T2}))",
        f"(Transpose (Select $A $M (GreaterThan $A $M)) {T2})",
    ),
    (
        "T-select-scalar",
        f"(Select (Transpose $A {T2}) {K(0.0, (5, 4))} (Transpose (GreaterThan $A $M) {T2}))",
        f"(Transpose (Select $A {K(0.0, (4, 5))} (GreaterThan $A $M)) {T2})",
    ),
    # a transpose pair around a map cancels once the inner one moves out of the map
    ("cancel", f"(Transpose (Cos (Transpose $T {P3})) {P3})", "(Cos $T)"),
    # summing axis 0 of T^(1 0 2) sums axis 1 of T; the other axes keep their order
    (
        "reduce-T-ordered",
        '(Reduce (Transpose $T (vec-of 1 0 2)) "add" 0.0 0)',
        '(Reduce $T "add" 0.0 1)',
    ),
    (
        "reduce-T-ordered",
        '(Reduce (Transpose $T (vec-of 2 0 1)) "max" 0.0 0)',
        '(Reduce $T "max" 0.0 2)',
    ),
    # (T T^T)^T = T T^T: bmm-T swaps the operands, the transposes of the transposes cancel
    (
        "bmm-T",
        f"(Transpose (BatchMatmul $T (Transpose $T {P3})) {P3})",
        f"(BatchMatmul $T (Transpose $T {P3}))",
    ),
    (
        "bmm-TT",
        f"(BatchMatmul (Transpose (Transpose $T {P3}) {P3}) (Transpose $T {P3}))",
        f"(Transpose (BatchMatmul $T (Transpose $T {P3})) {P3})",
    ),
]


@pytest.mark.parametrize("name,term,expected", FIRES, ids=[f[0] for f in FIRES])
def test_layout_rule_fires(name, term, expected):
    assert equal_after(term, expected, LAYOUT)


HOLDS = [
    # removing axis 1 from (2 1 0) leaves (2 0): out of order, so no plain reduce of T
    (
        "reduce-T-unordered",
        '(Reduce (Transpose $T (vec-of 2 1 0)) "add" 0.0 1)',
        '(Reduce $T "add" 0.0 1)',
    ),
    # a permutation that moves the batch axis is not a batched product's transpose
    (
        "bmm-T-batch-moved",
        "(Transpose (BatchMatmul $T (Transpose $T (vec-of 0 2 1))) (vec-of 1 0 2))",
        "(BatchMatmul (Transpose (Transpose $T (vec-of 0 2 1)) (vec-of 1 0 2)) (Transpose $T (vec-of 1 0 2)))",
    ),
    # a select whose mask is not transposed like its branches keeps its transposes
    (
        "T-select-mask",
        f"(Select (Transpose $A {T2}) (Transpose $M {T2}) (GreaterThan (Transpose $A {T2}) {K(0.0, (5, 4))}))",
        f"(Transpose (Select $A $M (GreaterThan $A {K(0.0, (4, 5))})) {T2})",
    ),
    # operands transposed by different permutations do not share one transpose
    (
        "T-pow-mixed",
        f"(Power (Transpose $T {P3}) (Transpose $T (vec-of 0 1 2)))",
        f"(Transpose (Power $T $T) {P3})",
    ),
]


@pytest.mark.parametrize("name,term,unexpected", HOLDS, ids=[h[0] for h in HOLDS])
def test_layout_rule_guard_holds(name, term, unexpected):
    # the identities ruleset is left out: (vec-of 0 1 2) must stay a transpose here
    assert not equal_after(term, unexpected, ("layout", "transpose"))


def _transposed_program(a, b, F=dq):
    h = F.transpose(F.tanh(F.transpose(a, (0, 2, 1))), (0, 2, 1))
    s = F.transpose(h @ F.transpose(b, (0, 2, 1)), (0, 2, 1))
    return F.sum(F.sum(F.transpose(s, (1, 0, 2)), axis=0) ** 2)


def test_report_shows_the_layout_decisions():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((2, 5, 4)).astype(np.float32)
    j = dq.jit(_transposed_program)
    want = _transposed_program(a.astype(np.float64), b.astype(np.float64), np)
    np.testing.assert_allclose(float(j(a, b)), want, rtol=1e-5)
    fr = dq.optimize(j.lower(a, b)).report["_transposed_program"]
    (line,) = fr.layout
    # the pair around tanh cancels, the product's transpose folds into swapped operands
    # (bmm-T), the sum reads the untransposed axis (reduce-T-ordered): one transpose is left,
    # b's, which the batched product reads through its strides
    assert line.startswith("layout: transposes 5 -> 1 (4 moved away")
    for rule in ("transpose-transpose", "bmm-T", "reduce-T-ordered", "T-tanh"):
        assert f" {rule} x" in line
    assert "layout: transposes 5 -> 1" in str(j.report(a, b))


def test_report_says_nothing_of_layout_without_transposes():
    x = np.ones((3, 4), np.float32)
    fr = dq.optimize(dq.jit(lambda v: dq.sum(dq.tanh(v) * 2.0)).lower(x)).report
    assert all(f.layout == [] for f in fr)


def test_a_transpose_keeping_the_innermost_axis_is_priced_as_a_view():
    from dlvm_eq.extract.target_cost import TargetCost
    from dlvm_eq.ir.types import F32, tensor

    cost = TargetCost("cpu", {})
    t = tensor(16, 4, 128, 64, F32)
    heads = cost.term_cost("Transpose", t, None, perm=(0, 2, 1, 3))  # read in place, row by row
    moved = cost.term_cost("Transpose", t, None, perm=(0, 1, 3, 2))  # its readers' rows strided
    assert heads < moved / 4
    assert cost.term_cost("Transpose", t, None) == moved  # unknown axes: a copy, as before


def _swapped(fn) -> int:
    """Transposes of a function that swap the last two axes of a rank-4 tensor."""
    return sum(
        1 for i in fn.body if i.op == "transpose" and tuple(i.attrs.get("perm", ())) == (0, 1, 3, 2)
    )


def test_attention_scores_are_not_extracted_transposed():
    """(k q^T)^T is the scores' alternative (bmm-T). In the transformer step, with both head
    layouts of q and k shared with the gradient, it was priced equal to q k^T while every
    transpose was a copy, and extracted: the softmax then reduced strided rows and the step
    ran 8% slower. A head transpose (innermost axis kept) is priced as a view now, so the
    scores keep their rows: no more last-two-axes swaps than the program as written."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import models

    m = models.MODELS["transformer"]
    _, step = models.dlvm_step_functions(m)
    module = step.lower(m.params(), *m.data())
    (before,) = module.functions.values()
    (after,) = dq.optimize(module).module.functions.values()
    assert _swapped(after) <= _swapped(before) == 1
