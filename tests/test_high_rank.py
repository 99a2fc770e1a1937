"""Ranks above 4 (issue 31, bug 1): the shape analysis in rules/schema.egg gathers a transpose's
shape for every rank, so gradients flow through the fused-QKV idiom (rank 5) and pixel shuffle
(rank 6); where the analysis does stop, the adjoint error names the op it stopped at."""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest
from vocab_checks import TARGETS, assert_grads, assert_values

import dlvm_eq as dq
from dlvm_eq.ad.driver import AdjointError
from dlvm_eq.egraph import optimize as egraph_optimize
from dlvm_eq.egraph import rulefiles

B, T, H, D = 2, 3, 2, 4


def fused_qkv_attention(x, w):
    qkv = dq.reshape(x @ w, (B, T, 3, H, D)).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, D)
    q, k, v = qkv[0], qkv[1], qkv[2]
    att = dq.softmax(q @ dq.transpose(k, (0, 1, 3, 2)) / np.sqrt(D), axis=-1)
    return dq.sum(dq.tanh(att @ v))


def numpy_attention(x, w):
    qkv = (x @ w).reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.tanh((p / p.sum(-1, keepdims=True)) @ v).sum()


def pixel_shuffle(x, r=2):
    n, c, h, w = x.shape
    y = dq.reshape(x, (n, c // (r * r), r, r, h, w)).transpose(0, 1, 4, 2, 5, 3)
    return dq.reshape(y, (n, c // (r * r), h * r, w * r))


@pytest.mark.parametrize("target", TARGETS)
def test_fused_qkv_attention_gradient_through_a_rank5_transpose(target):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((B, T, 8)), rng.standard_normal((8, 3 * H * D)) * 0.3
    assert_values(fused_qkv_attention, (x, w), numpy_attention(x, w), target, rtol=1e-10)
    assert_grads(fused_qkv_attention, (x, w), target)


@pytest.mark.parametrize("target", TARGETS)
def test_pixel_shuffle_rank6_values_and_gradient(target):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 2, 3))
    want = x.reshape(1, 2, 2, 2, 2, 3).transpose(0, 1, 4, 2, 5, 3).reshape(1, 2, 4, 6)
    assert_values(pixel_shuffle, (x,), want, target, rtol=0, atol=0)
    weights = rng.standard_normal(want.shape)
    assert_grads(lambda x: dq.sum(dq.sin(pixel_shuffle(x)) * weights), (x,), target)


def test_transposes_of_rank_8_compose_and_differentiate():
    """Two rank-8 transposes (the algebra rule composes them for any rank) and the adjoint."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 1, 3, 2, 1, 2, 2))
    p, q = (7, 3, 0, 5, 1, 6, 2, 4), (2, 0, 1, 7, 6, 3, 5, 4)
    weights = rng.standard_normal(x.transpose(p).transpose(q).shape)

    def f(x):
        return dq.sum(dq.exp(dq.transpose(dq.transpose(x, p), q)) * weights)

    assert_values(f, (x,), np.sum(np.exp(x.transpose(p).transpose(q)) * weights), "cpu")
    assert_grads(f, (x,), "cpu")


def test_an_unknown_shape_is_reported_at_the_op_the_analysis_stopped_at(tmp_path, monkeypatch):
    """With the transpose's shape rule taken out of a copy of the rules, the adjoint of the sum
    downstream fails; the message names the transpose and its operand's shape."""
    rules = tmp_path / "rules"
    shutil.copytree(rulefiles.rules_dir(), rules)
    schema = (rules / "schema.egg").read_text()
    start = schema.index("(rule ((= e (Transpose a p))")
    end = schema.index("(rule ((= e (Reduce a c i k))")
    (rules / "schema.egg").write_text(schema[:start] + schema[end:])
    monkeypatch.setattr(rulefiles, "rules_dir", lambda: rules)
    monkeypatch.setattr(rulefiles, "_RULES_DIGEST", None)  # no adjoint cached for other rules
    # this thread's compiled sessions hold the shipped rules: build new ones from the copy
    monkeypatch.setattr(egraph_optimize, "_LOCAL", threading.local())

    def f(x):
        return dq.sum(dq.sin(dq.reshape(x, (2, 3, 3, 2, 4)).transpose(2, 0, 3, 1, 4)))

    with pytest.raises(AdjointError) as info:
        dq.jit(dq.grad(f), target="interp")(np.ones((2, 3, 24)))
    assert "gives no shape to `transpose` (Transpose) of operand shapes 2x3x3x2x4" in str(
        info.value
    )


@pytest.mark.parametrize("rank", range(0, 9))
def test_schema_shape_analysis_of_transpose_and_pad_shape_for_every_rank(rank):
    """The analysis alone, in an e-graph: a transpose of each rank by a rotation of its axes,
    and padShape at every position (the IR accepts any), get the shapes the op table gives."""
    from dlvm_eq.egraph.optimize import scratch_session

    shape = tuple(range(2, 2 + rank))
    perm = tuple(range(1, rank)) + (0,) if rank else ()
    vec = lambda xs: f"(vec-of {' '.join(map(str, xs))})" if xs else "(vec-empty)"
    lines = [f'(set (shape (Var "x")) {vec(shape)})', '(set (dtype (Var "x")) "f32")']
    lines.append(f'(let t (Transpose (Var "x") {vec(perm)}))')
    lines += [f'(let p{k} (PadShape (Var "x") {k}))' for k in range(rank + 1)]
    lines.append("(run-schedule (saturate (run analysis)))")
    lines.append(f"(check (= (shape t) {vec(tuple(shape[i] for i in perm))}))")
    lines += [
        f"(check (= (shape p{k}) {vec(shape[:k] + (1,) + shape[k:])}))" for k in range(rank + 1)
    ]
    with scratch_session() as session:
        session.run_text("\n".join(lines))  # a failed check raises


def test_a_rank5_transpose_and_its_inverse_cancel_in_the_optimizer():
    """transpose-transpose composes any rank, transpose-id drops the identity of any rank."""
    x = np.ones((2, 3, 2, 2, 3), np.float32)
    p = (1, 0, 3, 4, 2)
    back = tuple(int(i) for i in np.argsort(p))
    module = dq.make_ir(lambda x: dq.exp(dq.transpose(dq.transpose(x, p), back)))(x)
    text = str(dq.optimize(module, never_slower=False).module)  # the rules, not the guard
    assert "transpose" not in text and "exp %" in text
