"""The fused attention backward (issue 33): the kernel (codegen/runtime/attention_backward.py)
against float64 PyTorch and the interpreter's `attentionBackward`, with causal, padding and
dense biases at rank 3 and 4, bit-identical on any number of threads; value_and_grad of a
user's naive attention reaching it through rules/attention_adjoint.egg (and not reaching it
where there is no attention, or where the plain program is cheaper)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jit_reports import attention_lines, planned_ops

import dlvm_eq as dq
from dlvm_eq.codegen.runtime.attention_backward import attention_backward
from dlvm_eq.codegen.runtime.attention_cpu import attention_forward
from dlvm_eq.ir.attention_op import attention_backward as reference_backward

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _inputs(rng, batch, m, n, d, e, mask):
    q = rng.standard_normal(batch + (m, d)).astype(np.float32)
    k = rng.standard_normal(batch + (n, d)).astype(np.float32)
    v = rng.standard_normal(batch + (n, e)).astype(np.float32)
    g = rng.standard_normal(batch + (m, e)).astype(np.float32)
    if mask == "padding":  # per batch index, the keys past a random length are -inf
        keep = np.arange(n) < rng.integers(1, n + 1, size=batch + (1, 1))
        bias = np.where(keep, 0.0, -np.inf).astype(np.float32)
    elif mask == "dense":
        bias = rng.standard_normal(batch + (m, n)).astype(np.float32)
    else:
        bias = np.float32(0.0)
    return q, k, v, g, bias


def _fused(q, k, v, g, bias, scale, causal, threads=2, blocks=(16, 32), with_lse=True):
    o = np.empty(g.shape, np.float32)
    lse = np.empty(q.shape[:-1], np.float32) if with_lse else None
    attention_forward(q, k, v, bias, scale, causal, o, threads, blocks, lse=lse)
    grads = [np.full(a.shape, np.nan, np.float32) for a in (q, k, v)]
    attention_backward(q, k, v, bias, scale, causal, o, g, *grads, lse, threads, blocks)
    return grads


def torch64(q, k, v, g, bias, scale, causal):
    t = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v)]
    s = t[0] @ t[1].transpose(-1, -2) * scale + torch.tensor(np.asarray(bias), dtype=torch.float64)
    if causal:
        hidden = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
        s = s.masked_fill(hidden, -float("inf"))
    (torch.softmax(s, -1) @ t[2]).backward(torch.tensor(g, dtype=torch.float64))
    return [a.grad.numpy() for a in t]


def assert_close(got, want, rel=2e-5):
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("batch", [(3,), (2, 2)])
@pytest.mark.parametrize("mask", ["none", "padding", "dense"])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_backward_matches_float64_torch(batch, mask, causal):
    rng = np.random.default_rng(7)
    q, k, v, g, bias = _inputs(rng, batch, 70, 90, 12, 10, mask)
    for with_lse in (True, False):  # the forward's log-sum-exp, or recomputed
        got = _fused(q, k, v, g, bias, 0.3, causal, with_lse=with_lse)
        for a, b in zip(got, torch64(q, k, v, g, bias, 0.3, causal)):
            assert_close(a, b)


@settings(max_examples=20, deadline=None)
@given(
    batch=st.sampled_from([(1,), (2,), (1, 3)]),
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    d=st.integers(1, 8),
    e=st.integers(1, 8),
    mask=st.sampled_from(["none", "padding", "dense"]),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fused_backward_matches_the_interpreter(batch, m, n, d, e, mask, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v, g, bias = _inputs(rng, batch, m, n, d, e, mask)
    if causal and mask == "padding":  # keep key 0 visible: no row with every key hidden
        bias[..., 0] = 0
    scale = 1.0 / np.sqrt(d)
    got = _fused(q, k, v, g, bias, scale, causal, blocks=(8, 16))
    args = [np.asarray(a, np.float64) for a in (q, k, v, bias)]
    o = reference_attention64(*args, scale, causal)
    for wrt in range(3):
        want = reference_backward(
            [*args, o, g.astype(np.float64)], {"scale": scale, "causal": causal, "wrt": wrt}
        )
        assert_close(got[wrt], want)


def reference_attention64(q, k, v, bias, scale, causal):
    from dlvm_eq.ir.attention_op import attention

    return attention([q, k, v, bias], {"scale": scale, "causal": causal})


@pytest.mark.parametrize("causal", [False, True])
def test_results_are_bit_identical_on_any_number_of_threads(causal):
    rng = np.random.default_rng(8)
    q, k, v, g, bias = _inputs(rng, (2, 2), 100, 140, 8, 8, "dense")
    one = _fused(q, k, v, g, bias, 0.25, causal, threads=1)
    for threads in (2, 3, 8):
        for a, b in zip(one, _fused(q, k, v, g, bias, 0.25, causal, threads=threads)):
            assert np.array_equal(a, b)


T = 1024  # the shipped CPU defaults price the fused kernels below the plain program here
MASK = np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf).astype(np.float32)


def heads(q, k, v):
    s = (q @ dq.transpose(k, (0, 1, 3, 2))) * 0.25
    return dq.sum(dq.softmax(s, axis=-1) @ v)


def heads_causal(q, k, v):
    s = (q @ dq.transpose(k, (0, 1, 3, 2))) * 0.25 + MASK
    return dq.sum(dq.softmax(s, axis=-1) @ v)


def rank3(q, k, v):
    return dq.sum(dq.softmax((q @ dq.transpose(k, (0, 2, 1))) * 0.25, axis=-1) @ v)


@pytest.mark.parametrize(
    "fn, shape, causal",
    [
        (heads, (1, 2, T, 16), False),
        (heads_causal, (1, 1, T, 16), True),
        (rank3, (2, T, 16), False),
    ],
)
def test_value_and_grad_runs_the_fused_backward(fn, shape, causal):
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    step = dq.jit(dq.value_and_grad(fn, argnums=(0, 1, 2)))
    value, grads = step(q, k, v)
    report = step.report(q, k, v)
    ops = planned_ops(step, fn.__name__, q, k, v)
    assert ops.count("attentionBackward") == 3 and "attention" in ops, ops
    plan = str(report.plan)
    assert plan.count("attentionBackward(") == 1  # one step for dQ, dK and dV
    assert "  copy:" not in plan, plan  # dQ, dK and dV written straight into the outputs
    lines = attention_lines(report, fn.__name__)
    assert any("fused backward chosen" in line for line in lines), lines
    want = torch64(q, k, v, np.ones(q.shape, np.float32), 0.0, 0.25, causal)
    for a, b in zip(grads, want):
        assert_close(a, b, 1e-4)


def test_plain_backward_where_the_plain_program_is_cheaper():
    """A short sequence: the forward stays plain, and so does the backward."""
    rng = np.random.default_rng(10)
    q, k, v = (rng.standard_normal((1, 2, 16, 8)).astype(np.float32) for _ in range(3))
    step = dq.jit(dq.value_and_grad(heads, argnums=(0, 1, 2)))
    _, grads = step(q, k, v)
    ops = planned_ops(step, "heads", q, k, v)
    assert "attentionBackward" not in ops and "attention" not in ops, ops
    for a, b in zip(grads, torch64(q, k, v, np.ones(q.shape, np.float32), 0.0, 0.25, False)):
        assert_close(a, b, 1e-4)


def columns(q, k, v):  # softmax over the queries: not attention
    return dq.sum(dq.softmax((q @ dq.transpose(k, (0, 1, 3, 2))) * 0.25, axis=2) @ v)


def test_no_fused_backward_without_an_attention():
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((1, 1, T, 16)).astype(np.float32) for _ in range(3))
    step = dq.jit(dq.value_and_grad(columns, argnums=(0, 1, 2)))
    ops = planned_ops(step, "columns", q, k, v)
    assert "attentionBackward" not in ops and "attention" not in ops, ops


BACKWARD_TEXT = """module "a"
stage raw
func @f: (<2 x 4 x 3 x f64>, <2 x 5 x 3 x f64>, <2 x 5 x 2 x f64>, <2 x 4 x 2 x f64>, <2 x 4 x 2 x f64>) -> <2 x 5 x 3 x f64> {
'entry(%q: <2 x 4 x 3 x f64>, %k: <2 x 5 x 3 x f64>, %v: <2 x 5 x 2 x f64>, %o: <2 x 4 x 2 x f64>, %g: <2 x 4 x 2 x f64>):
    %d = attentionBackward %q: <2 x 4 x 3 x f64>, %k: <2 x 5 x 3 x f64>, %v: <2 x 5 x 2 x f64>, 0.0: f64, %o: <2 x 4 x 2 x f64>, %g: <2 x 4 x 2 x f64> scale 0.5 causal wrt 1
    return %d: <2 x 5 x 3 x f64>
}
"""


def test_attention_backward_parses_prints_back_and_is_differentiated_as_plain():
    """Its adjoint is the plain program's (egraph/attention_plain.py; checked against finite
    differences in tests/test_attention_second_order.py): no attentionBackward is left."""
    from dlvm_eq.ad.driver import adjoint_function
    from dlvm_eq.ir.parser import parse

    m = parse(BACKWARD_TEXT)
    assert str(parse(str(m))) == str(m)
    adj = adjoint_function(m, m["f"], optimize=False)
    assert "attentionBackward" not in [inst.op for inst in adj.body]


def test_vmap_of_attention_backward_is_a_loop_over_examples():
    """The registry's batching rule: batched q, g and bias, unbatched k, v and o."""
    from dlvm_eq.ir import FunctionBuilder, Module
    from dlvm_eq.ir.batching import batch_function
    from dlvm_eq.ir.interp import interpret
    from dlvm_eq.ir.types import DType, TensorType

    shapes = ((2, 3, 4), (2, 5, 4), (2, 5, 6), (1, 5), (2, 3, 6), (2, 3, 6))
    types = [TensorType(s, DType.f64) for s in shapes]
    b = FunctionBuilder("f", types, ["q", "k", "v", "pad", "o", "g"])
    f = b.finish(b.emit("attentionBackward", list(b.params), scale=0.5, causal=1, wrt=1))
    batched = [True, False, False, True, False, True]
    g, _ = batch_function(f, batched=batched, size=3)
    rng = np.random.default_rng(12)
    args = [rng.standard_normal(((3,) if bt else ()) + s) for s, bt in zip(shapes, batched)]
    args[3] = np.where(rng.random((3, 1, 5)) < 0.3, -1e9, 0.0)
    m = Module("t")
    m.add(g)
    got = interpret(m, g.name, *args)
    attrs = {"scale": 0.5, "causal": 1, "wrt": 1}
    want = np.stack(
        [
            reference_backward([a[i] if bt else a for a, bt in zip(args, batched)], attrs)
            for i in range(3)
        ]
    )
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def biased(q, k, v, b):
    s = (q @ dq.transpose(k, (0, 1, 3, 2))) * 0.25 + b
    return dq.sum(dq.softmax(s, axis=-1) @ v)


def test_a_differentiated_bias_keeps_the_plain_program():
    """The fused op gives its bias (a mask) no adjoint: a learned bias's gradient must come
    from the plain program, and it equals torch's."""
    rng = np.random.default_rng(13)
    q, k, v = (rng.standard_normal((1, 1, T, 16)).astype(np.float32) for _ in range(3))
    b = rng.standard_normal((1, 1, 1, T)).astype(np.float32)
    step = dq.jit(dq.value_and_grad(biased, argnums=(0, 3)))
    _, (gq, gb) = step(q, k, v, b)
    ops = planned_ops(step, "biased", q, k, v, b)
    assert "attentionBackward" not in ops, ops
    tq, tb = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, b))
    s = tq @ torch.tensor(k, dtype=torch.float64).transpose(-1, -2) * 0.25 + tb
    (torch.softmax(s, -1) @ torch.tensor(v, dtype=torch.float64)).sum().backward()
    assert_close(gq, tq.grad.numpy(), 1e-4)
    assert_close(gb, tb.grad.numpy(), 1e-4)


def test_strided_outputs_and_unwanted_results():
    """Outputs that are views of a larger array get the same values; dQ may be left out."""
    rng = np.random.default_rng(14)
    q, k, v, g, bias = _inputs(rng, (2,), 40, 50, 8, 6, "padding")
    want = _fused(q, k, v, g, bias, 0.3, False)
    o = np.empty(g.shape, np.float32)
    attention_forward(q, k, v, bias, 0.3, False, o)
    big = [np.zeros(a.shape[:-1] + (2 * a.shape[-1],), np.float32) for a in (q, k, v)]
    views = [b[..., ::2] for b in big]
    attention_backward(q, k, v, bias, 0.3, False, o, g, None, views[1], views[2])
    for a, b in zip(views[1:], want[1:]):
        assert_close(a, b, 1e-6)
    assert not big[0].any()


def test_a_backward_step_with_a_scalar_bias_reads_o_and_g():
    """The fused ops as extraction writes them, with a constant scalar bias (no operand slot
    for it): the step read g where o belongs before (a missing-argument TypeError)."""
    from dlvm_eq.ir import FunctionBuilder, Module
    from dlvm_eq.ir.types import DType, TensorType
    from dlvm_eq.pipeline.native import compile as native_compile

    shape = (2, 3, 40, 8)
    t = TensorType(shape, DType.f32)
    b = FunctionBuilder("step", [t, t, t, t], ["q", "k", "v", "g"])
    q_, k_, v_, g_ = b.params
    bias = b.const(0.5, DType.f32)
    o = b.emit("attention", [q_, k_, v_, bias], scale=0.25, causal=1)
    grads = [
        b.emit("attentionBackward", [q_, k_, v_, bias, o, g_], scale=0.25, causal=1, wrt=i)
        for i in range(3)
    ]
    m = Module("step")
    m.add(b.finish([o, *grads]))
    compiled = native_compile(m, "step", "cpu", optimize=False)
    rng = np.random.default_rng(12)
    q, k, v, g = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
    _, *got = compiled(q, k, v, g)
    for a, w in zip(got, torch64(q, k, v, g, 0.5, 0.25, True)):
        assert_close(a, w, 1e-4)
