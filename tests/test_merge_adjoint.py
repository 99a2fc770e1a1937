"""rules/merge_adjoint.egg (opt-in, issue 33): the weights' adjoints x^T dQ, x^T dK, x^T dV of
projections whose forward was merged (x@[[Wq|Wk]|Wv]) are slices of one product
x^T [dQ|dK|dV]. verify-rules proves the file; the rules fire on a transformer step and not
where the adjoints' widths differ from the weights' or x's forward was not merged; extracted
(with the concatenation priced free: at these sizes its copy costs more than the calls it
saves), the step's gradients are float64 PyTorch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_algebra_rules import _decls

import dlvm_eq as dq
from dlvm_eq.egraph import RuleFileError
from dlvm_eq.egraph.optimize import scratch_session
from dlvm_eq.egraph.rulefiles import rules_dir
from dlvm_eq.egraph.ruleset_schedule import Budget, Schedule
from dlvm_eq.egraph.saturate import saturate
from dlvm_eq.extract import target_cost
from dlvm_eq.verify import verify_rules

FILE = rules_dir() / "merge_adjoint.egg"
TWO, THREE = (
    "merge: x^T dY1,x^T dY2 (xA,xB merged)",
    "merge: x^T dY1,x^T dY2,x^T dY3 (xA,xB,xC merged)",
)
XT = "(Transpose $X (vec-of 1 0))"


def test_verify_rules_proves_the_file():
    report = verify_rules(FILE)
    assert report.ok_strict and report.count("proven") == 2, report.render()


def _merged(forward: str, widths: tuple[int, ...]) -> bool:
    """Whether x^T (Exp $Gi) (Gi: 7 x widths[i]) equal slices of x^T [..] after the merge
    rulesets, with `forward` in the e-graph (X 7 x 6, V 6 x 2, C 6 x 3, W 6 x 4)."""
    shapes = {f"G{i}": (7, n) for i, n in enumerate(widths)} | {"W": (6, 4)}
    decls = "".join(
        f'(let ${n} (Var "{n}")) (set (shape ${n}) (vec-of {r} {c})) (set (dtype ${n}) "f32")\n'
        for n, (r, c) in shapes.items()
    )
    gs = [f"(Exp $G{i})" for i in range(len(widths))]
    cat = gs[0]
    for g in gs[1:]:
        cat = f"(Concatenate {cat} {g} 1)"
    cuts = np.cumsum((0,) + widths)
    with scratch_session() as s:
        s.run_text(FILE.read_text())
        products = "".join(f"(let $p{i} (Dot {XT} {g}))\n" for i, g in enumerate(gs))
        s.run_text(_decls() + decls + f"(let $fwd {forward})\n" + products)
        saturate(s, Schedule(("merge", "merge-adjoint")), Budget(iterations=4))
        try:
            for i in range(len(gs)):
                s.run_text(f"(check (= $p{i} (Slice (Dot {XT} {cat}) 1 {cuts[i]} {cuts[i + 1]})))")
            return True
        except RuleFileError:
            return False


def test_two_adjoints_of_merged_projections_are_slices_of_one_product():
    assert _merged("(Dot $X (Concatenate $V $C 1))", (2, 3))


def test_three_adjoints_of_merged_projections_are_slices_of_one_product():
    assert _merged("(Dot $X (Concatenate (Concatenate $V $C 1) $W 1))", (2, 3, 4))


def test_not_where_the_widths_differ_from_the_weights():
    assert not _merged("(Dot $X (Concatenate $V $C 1))", (2, 4))
    assert not _merged("(Dot $X (Concatenate (Concatenate $V $C 1) $W 1))", (2, 3, 5))


def test_not_where_the_forward_was_not_merged():
    # x@V, x@C as separate products of another operand: no merged forward of X in the e-graph
    assert not _merged("(Dot (Exp $X) (Concatenate $V $C 1))", (2, 3))


B, T, D, H = 2, 8, 16, 2


def loss(wq, wk, wv, wo, x):
    def heads(t):
        return dq.transpose(dq.reshape(t, (B, T, H, D // H)), (0, 2, 1, 3))

    q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
    s = dq.softmax((q @ dq.transpose(k, (0, 1, 3, 2))) * 0.25, axis=-1)
    ctx = dq.reshape(dq.transpose(s @ v, (0, 2, 1, 3)), (B, T, D))
    return dq.sum(dq.tanh(ctx @ wo))


def _torch_grads(args):
    ws = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in args[:4]]
    x = torch.tensor(args[4], dtype=torch.float64)

    def heads(t):
        return t.reshape(B, T, H, D // H).transpose(1, 2)

    q, k, v = heads(x @ ws[0]), heads(x @ ws[1]), heads(x @ ws[2])
    s = torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1)
    ctx = (s @ v).transpose(1, 2).reshape(B, T, D)
    torch.tanh(ctx @ ws[3]).sum().backward()
    return [w.grad.numpy() for w in ws]


@pytest.fixture
def args():
    rng = np.random.default_rng(5)
    ws = [(rng.standard_normal((D, D)) * 0.3).astype(np.float32) for _ in range(4)]
    return ws + [rng.standard_normal((B, T, D)).astype(np.float32)]


def _dots_of_xt_concat(fn) -> list:
    """The products whose right operand is a concatenation of three or more parts."""
    defs = {ins.result.name: ins for ins in fn.body}

    def parts(v):
        ins = defs.get(getattr(v, "name", None))
        if ins is None or ins.op != "concatenate":
            return 1
        return sum(parts(o) for o in ins.operands)

    return [ins for ins in fn.body if ins.op == "dot" and parts(ins.operands[1]) >= 3]


def test_fires_on_a_transformer_step_and_extracted_gives_torchs_gradients(args, monkeypatch):
    term_cost = target_cost.TargetCost.term_cost

    def views_free(self, op, t, child, *rest, **kw):
        if op in ("Slice", "Concatenate"):
            return 0.0
        return term_cost(self, op, t, child, *rest, **kw)

    monkeypatch.setattr(target_cost.TargetCost, "term_cost", views_free)
    monkeypatch.setattr(
        target_cost.TargetCost, "concatenation_seconds", lambda self, t, nested=None: 0.0
    )
    step = dq.jit(dq.value_and_grad(loss, argnums=(0, 1, 2, 3)), rules=[str(FILE)])
    _, grads = step(*args)
    report = step.report(*args)
    monkeypatch.undo()
    fired = {k: n for fr in report.optimize.report for k, n in fr.saturation.rule_matches.items()}
    assert fired.get(THREE, 0) >= 1 and fired.get(TWO, 0) >= 1, fired
    fn = next(iter(report.optimize.module.functions.values()))
    # the forward's x@[..|..|..] and the weights' adjoints x^T [dQ|dK|dV]
    assert len(_dots_of_xt_concat(fn)) == 2, fn
    for got, want in zip(grads, _torch_grads(args)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_without_the_file_the_step_keeps_three_products(args, no_ir_cache):
    # differentiated afresh (no_ir_cache, conftest.py): the test above stored this adjoint in
    # the IR cache, and a cached adjoint's report has no e-graph to read
    step = dq.jit(dq.value_and_grad(loss, argnums=(0, 1, 2, 3)))
    report = step.report(*args)  # first: the compile that builds the e-graph reports it
    _, grads = step(*args)
    # without a user's rules the step saturates once, with its adjoint (issue 32): read that
    # e-graph's rules, or the module pass's where it ran
    saturations = (
        [fr.saturation for fr in report.optimize.report]
        if report.optimize is not None
        else [a.saturation for a in report.adjoints if a.saturation is not None]
    )
    assert saturations, report
    fired = {k: n for s in saturations for k, n in s.rule_matches.items()}
    assert THREE not in fired and TWO not in fired, fired
    for got, want in zip(grads, _torch_grads(args)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
