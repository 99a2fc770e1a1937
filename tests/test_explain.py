"""`--explain` / `optimize(..., explain=True)`: each result is shown as written and as extracted
(infix, the same renderer as `dlvm-eq query`), cut short with `...` when it is large."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import dlvm_eq as dq
from dlvm_eq.cli import main
from dlvm_eq.egraph.optimize import RENDER_LIMIT
from dlvm_eq.pipeline import optimize

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_matrix_chain_result_before_and_after():
    module = dq.load(EXAMPLES / "matrix_chain.dl")  # the e-graph's program, not the guard's
    report = optimize(module, explain=True, never_slower=False).report["chain"]
    assert report.results == [("A @ B @ C @ D", "A @ (B @ C) @ D")]
    text = str(report)
    assert "  result: A @ B @ C @ D\n      ->  A @ (B @ C) @ D" in text


def test_unchanged_results_and_no_explanation_by_default():
    # (logreg.dl is no longer unchanged: its log(sigmoid) becomes softplus, test_stable_rules.py;
    # nor is softplus.dl: softplus(x) = softplus(-x) + x leaves it one softplus)
    def f(x):
        return dq.tanh(x) * dq.exp(x)

    module = dq.make_ir(f)(np.zeros((4, 3), np.float32))
    assert optimize(module).report["f"].results == []
    report = optimize(module, explain=True).report["f"]
    assert report.kept_original and "(unchanged)" in str(report)
    assert "tanh(x) * exp(x)" in report.results[0][0]


def test_large_results_are_cut_short():
    def deep(x):
        for _ in range(12):  # a DAG that written as a tree has 2**12 leaves
            x = dq.tanh(x) * dq.sigmoid(x)
        return x

    module = dq.make_ir(deep)(np.zeros((3,), np.float32))
    ((before, after),) = optimize(module, explain=True).report.functions.popitem()[1].results
    for text in (before, after):
        assert "..." in text and text.count("(") <= 2 * RENDER_LIMIT


def test_cli_explain_prints_the_results(capsys, tmp_path):
    code = main(
        [
            "opt",
            str(EXAMPLES / "softplus.dl"),
            "--rules",
            str(EXAMPLES / "rules" / "softplus.egg"),
            "--explain",
            "--no-never-slower",
            "-o",
            str(tmp_path / "out.dl"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 0
    assert "result: (softplus(x) - softplus(-x)) * 2\n      ->  x * 2" in err
