"""Tutorial: read a compile report (e-graph size, rules fired, fusion, kernels, predicted
against measured time).

Run from the repository root: `python docs/tutorials/compile_report.py`. Every claim the page
(docs/tutorials/compile-report.md) makes is an assert below; tests/test_tutorials.py runs it.
"""

from __future__ import annotations

import numpy as np

import dlvm_eq as dq
from dlvm_eq.pipeline.measure_time import measure_compiled


def loss(w, b, x, y):
    p = dq.sigmoid(x @ w + b)
    return -dq.mean(y * dq.log(p) + (1 - y) * dq.log(1 - p))


def main() -> None:
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal(64).astype(np.float32), np.float32(0)
    x = rng.standard_normal((4096, 64)).astype(np.float32)
    y = (rng.random(4096) < 0.5).astype(np.float32)

    # 1. The report of a jitted function: compiling happens on the first call, once per
    #    argument shapes and dtypes; `report` says what that compile did.
    step = dq.jit(dq.value_and_grad(loss, argnums=(0, 1)))
    value, (dw, db) = step(w, b, x, y)
    report = step.report(w, b, x, y)
    print(report, end="\n\n")
    text = str(report)

    # A jitted gradient saturates its algebra once, in the e-graph that builds the adjoint; the
    # step's own pass is skipped, and the report says so (issue 32)
    assert "algebra saturated once, with the adjoint" in text
    # ...and shows that e-graph: its e-classes, e-nodes before -> after, why saturation stopped,
    # the rules that fired and the cost extracted for forward and gradient together
    (adjoint,) = report.adjoints
    asat = adjoint.saturation
    assert (
        f"e-graph (the adjoint of @loss, forward and gradient together): {adjoint.e_classes} "
        f"e-classes, e-nodes {asat.nodes_before} -> {asat.nodes} ({asat.stop_reason}"
    ) in text
    # the stable forms fired there: log(sigmoid z) became -softplus(-z) in the gradient
    assert asat.rule_matches.get("stable: log(sigmoid z)", 0) > 0
    # The e-graph section of a function that is optimized as a whole (here the loss alone):
    # e-classes after saturation, e-nodes before -> after, and why saturation stopped
    forward = dq.jit(loss)
    forward(w, b, x, y)
    forward_report = forward.report(w, b, x, y)
    print(forward_report, end="\n\n")
    opt = forward_report.optimize.report["loss"]
    sat = opt.saturation
    forward_text = str(forward_report)
    assert (
        f"e-graph: {opt.e_classes} e-classes, e-nodes {sat.nodes_before} -> {sat.nodes}"
        in forward_text
    )
    assert sat.nodes > sat.nodes_before  # the rules added equivalent forms
    # rules fired: the rules that matched, most matches first (`--x` is -(-x) = x)
    assert "rules fired: " in forward_text and sat.rule_matches
    # cost (model): the whole program before and after extraction, by the cost model
    assert opt.cost_after <= opt.cost_before
    # fusion: how many elementwise values were kept in buffers and how many recomputed inside
    # the kernels that read them
    fusion = report.plan.fusion
    assert (
        fusion.inlined > 0 and fusion.values == fusion.materialized + fusion.forced + fusion.inlined
    )
    # kernels (fused loops compiled by llvmlite, named after the ops they run) and matmuls
    # (BLAS calls). The log of a sigmoid is gone: the stable forms (ruleset `stable`) made it
    # a softplus when the gradient was built, before this e-graph ran.
    assert f"kernels: {len(report.kernel_names)}" in text
    assert any("softplus" in k for k in report.kernel_names)
    assert not any("log" in k or "sigmoid" in k for k in report.kernel_names[:1])
    assert "matmuls: 2" in text  # x @ w forward, and x^T-times-adjoint backward
    # the gradient is finite and right (the stable forms keep it so for every z)
    p = 1 / (1 + np.exp(-(x.astype(np.float64) @ w + b)))
    np.testing.assert_allclose(dw, x.T @ (p - y) / len(y), rtol=1e-3, atol=1e-5)

    # 2. Predicted against measured: `dq.compile` a module (here the traced one; a .dl file
    #    works alike), time it, and the report prints both, step by step.
    module = dq.make_ir(loss)(w, b, x, y)
    f = dq.compile(module, "loss")
    measured = measure_compiled(f, [w, b, x, y], repeats=20)
    print(f.report)
    print(f.report.predicted.table(measured.steps))
    assert "measured median" in str(f.report) and "predicted / measured" in str(f.report)
    ratio = f.report.predicted.seconds / measured.median
    print(f"predicted / measured: {ratio:.2f}")
    assert 0.05 < ratio < 20  # the same order of magnitude, even on a loaded machine
    assert len(measured.steps) == len(f.report.predicted.steps)


if __name__ == "__main__":
    main()
