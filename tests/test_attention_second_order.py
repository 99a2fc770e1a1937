"""Second order through the fused attention (issue 33): a function holding an
`attentionBackward` (a gradient, differentiated again) is differentiated as the plain program
(egraph/attention_plain.py writes the fused ops back as the naive formula). Checked against
float64 central differences of the interpreter's own fused ops, on random shapes (hypothesis),
and `dq.grad` of a function calling `dq.grad` at a size where the inner gradient is the fused
backward, against float64 PyTorch's double backward."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_adjoint_rules import fd_check

import dlvm_eq as dq
from dlvm_eq.egraph.attention_plain import with_plain_attention
from dlvm_eq.ir.module import FunctionBuilder
from dlvm_eq.ir.types import DType, tensor

F64 = DType.f64


def _backward_fn(batch, m, n, d, e, causal, wrt, dense):
    """f(q, k, v, g[, bias]) = attentionBackward(q, k, v, bias, attention(q, k, v, bias), g)."""
    types = [tensor(*batch, m, d, F64), tensor(*batch, n, d, F64), tensor(*batch, n, e, F64)]
    types.append(tensor(*batch, m, e, F64))
    if dense:
        types.append(tensor(*batch, m, n, F64))
    b = FunctionBuilder("f", types, ["q", "k", "v", "g", "bias"][: len(types)])
    q, k, v, g = b.params[:4]
    bias = b.params[4] if dense else b.const(0.0, F64)
    attrs = {"scale": 0.5, "causal": int(causal)}
    o = b.emit("attention", [q, k, v, bias], **attrs)
    return b.finish(b.emit("attentionBackward", [q, k, v, bias, o, g], wrt=wrt, **attrs))


@settings(max_examples=15, deadline=None)
@given(
    batch=st.sampled_from([(1,), (2,), (1, 2)]),
    m=st.integers(1, 4),
    extra=st.integers(0, 2),
    d=st.integers(1, 3),
    e=st.integers(1, 3),
    causal=st.booleans(),
    wrt=st.sampled_from([0, 1, 2]),
    dense=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_grad_of_the_fused_backward_matches_finite_differences(
    batch, m, extra, d, e, causal, wrt, dense, seed
):
    rng = np.random.default_rng(seed)
    fn = _backward_fn(batch, m, m + extra, d, e, causal, wrt, dense)  # no row wholly hidden
    args = [rng.uniform(-1, 1, p.type.shape) for p in fn.params]
    fd_check(fn, args, wrt=list(range(len(args) - dense)), rng=rng, rtol=1e-6, optimize=False)


def test_the_plain_program_replaces_only_fused_ops():
    fn = _backward_fn((2,), 3, 4, 2, 2, True, 1, False)
    plain = with_plain_attention(fn, None)
    ops = [inst.op for inst in plain.body]
    assert "attention" not in ops and "attentionBackward" not in ops
    assert ops.count("exp") == 2 and "literal" in ops  # two softmaxes; the causal mask
    b = FunctionBuilder("g", [tensor(2, F64)], ["x"])
    untouched = b.finish(b.emit("exp", [b.params[0]]))
    assert with_plain_attention(untouched, None) is untouched


def loss(q, k, v):
    return dq.sum(dq.softmax((q @ dq.transpose(k, (0, 1, 3, 2))) * 0.25, axis=-1) @ v)


def curvature(q, k, v):
    gq = dq.grad(loss, argnums=0)(q, k, v)
    return dq.sum(gq * gq)


def test_grad_of_grad_through_the_fused_backward_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 1, 1024, 16)).astype(np.float32) for _ in range(3))
    inner = [inst.op for inst in dq.make_ir(curvature)(q, k, v)["curvature"].body]
    assert "attentionBackward" in inner  # the inner gradient is the fused backward
    got = dq.jit(dq.grad(curvature, argnums=(0, 1, 2)))(q, k, v)
    t = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v)]
    out = torch.softmax(t[0] @ t[1].transpose(-1, -2) * 0.25, -1) @ t[2]
    (gq,) = torch.autograd.grad(out.sum(), t[0], create_graph=True)
    (gq * gq).sum().backward()
    for a, w in zip(got, t):
        want = w.grad.numpy()
        np.testing.assert_allclose(a, want, rtol=0, atol=2e-3 * np.abs(want).max())
