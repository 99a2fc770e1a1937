"""The gpu cost model chooses the fused attention kernel (issue 33): extract/attention_cost.py
prices the PTX forward and backward (codegen/gpu/attention_ptx.py, attention_backward_ptx.py)
per launch, so extraction for the gpu target picks the fused op or the plain program by
predicted cost, and the report prints both. A user's attention (`softmax(q kᵀ s + mask) v`,
written with the DSL) is jitted for the gpu on the emulated device (tests/fake_cupy.py) and
checked against float64 numpy. No device was lent: the prices are the shipped gpu machine's
(an H100-class profile), not measured."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jit_reports import attention_lines, planned_ops
from shipped_cost_model import shipped_cost_model  # noqa: F401 - autouse for this module

import dlvm_eq as dq
from dlvm_eq.codegen.gpu import attention_ptx
from dlvm_eq.egraph.attention_plain import priced_as_written
from dlvm_eq.extract import attention_cost
from dlvm_eq.extract.machine import MACHINES
from dlvm_eq.ir.types import DType, TensorType

ATTRS = {"scale": 0.125, "causal": 0}
# fake_cupy assembles every PTX it loads
needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")


def _types(batch, m, n, d=64):
    q, kv = TensorType(batch + (m, d), DType.f32), TensorType(batch + (n, d), DType.f32)
    return [q, kv, kv, TensorType((), DType.f32)]


def _prices(types, backward, attrs=ATTRS):
    return tuple(priced_as_written(types, attrs, f, backward, "gpu") for f in (True, False))


def test_the_priced_tiles_are_the_kernels():
    assert attention_cost.GPU_QUERY_BLOCK == attention_ptx.QUERY_BLOCK
    assert attention_cost.GPU_KEY_BLOCK == attention_ptx.KEY_BLOCK


@pytest.mark.parametrize("batch, seq", [((1, 4), 4096), ((8, 8), 1024), ((4, 8), 2048)])
@pytest.mark.parametrize("backward", [False, True])
def test_long_sequences_price_the_fused_kernels_cheaper(batch, seq, backward):
    """Enough rows to fill the lanes: the plain program's score traffic costs more than the
    fused kernel's re-reads of k and v."""
    fused, plain = _prices(_types(batch, seq, seq), backward)
    assert math.isfinite(fused) and fused < plain, (fused, plain)


@pytest.mark.parametrize("backward", [False, True])
def test_few_queries_over_many_keys_price_the_plain_program_cheaper(backward):
    """Two query rows: two threads walk 4096 keys each, against cuBLAS products."""
    fused, plain = _prices(_types((1,), 2, 4096), backward)
    assert plain < fused < math.inf, (fused, plain)


def test_the_forward_price_is_the_flop_count_at_the_flop_rate_when_compute_bound():
    """The issue's count: 4·B·m·n·(d+e)/2 flops (plus the exp), and q, k, v and o moved once
    plus k and v per query block; at (64, 4096, 4096, 64) the flops dominate."""
    mc = MACHINES["gpu"]
    b, m, n, d = 64, 4096, 4096, 64
    x = TensorType((b, m, d), DType.f32)
    got = attention_cost.gpu_attention_seconds(mc, x, x, x, x)
    flops = 4 * b * m * n * (d + d) / 2
    moved = 4 * b * m * d * 4 + 2 * b * n * d * 4 * (m // 64)
    assert flops / mc.flop_rate > moved / mc.bandwidth
    assert 1.0 < got / (flops / mc.flop_rate) < 1.1, got
    backward = attention_cost.gpu_attention_backward_seconds(mc, x, x, x, x)
    assert 3.0 < backward / got < 4.0  # dq: 2(2d + e), dkv: 2(2d + 2e) flops a score


def test_causal_visits_about_half_the_scores():
    mc = MACHINES["gpu"]
    x = TensorType((16, 4096, 64), DType.f32)
    full = attention_cost.gpu_attention_seconds(mc, x, x, x, x)
    causal = attention_cost.gpu_attention_seconds(mc, x, x, x, x, causal=True)
    assert 0.45 < causal / full < 0.6, causal / full


def test_a_shape_the_kernel_does_not_cover_is_not_priced_fused():
    """Three batch dims: the gpu step runs the reference, which writes the scores."""
    x = TensorType((2, 2, 2, 8, 4), DType.f32)
    assert attention_cost.gpu_attention_seconds(MACHINES["gpu"], x, x, x, x) == math.inf


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    batch=st.lists(st.integers(1, 8), max_size=2),
    m=st.integers(1, 3000),
    n=st.integers(1, 3000),
    d=st.sampled_from([8, 64, 128]),
    e=st.sampled_from([8, 64]),
)
def test_gpu_prices_grow_with_the_work(batch, m, n, d, e):
    """More keys never cost less; causal never more; the backward dearer than the forward."""
    mc, b = MACHINES["gpu"], tuple(batch)
    q, o = TensorType(b + (m, d), DType.f32), TensorType(b + (m, e), DType.f32)

    def price(keys, causal=False, backward=False):
        k, v = TensorType(b + (keys, d), DType.f32), TensorType(b + (keys, e), DType.f32)
        f = (
            attention_cost.gpu_attention_backward_seconds
            if backward
            else (attention_cost.gpu_attention_seconds)
        )
        return f(mc, q, k, v, o, causal)

    assert math.isfinite(price(n))
    assert price(n) <= price(n + 64)
    assert price(n, causal=True) <= price(n)
    assert price(n) < price(n, backward=True)


def attn(q, k, v, mask):
    return dq.softmax(q @ dq.transpose(k, (0, 2, 1)) * 0.5 + mask, axis=-1) @ v


def attn_loss(q, k, v, mask, w):
    return dq.sum(attn(q, k, v, mask) * w)


def _softmax64(q, k, mask):
    s = q @ np.swapaxes(k, -1, -2) * 0.5 + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _inputs(m, n, d, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, m, d)).astype(np.float32)
    k, v = (rng.standard_normal((2, n, d)).astype(np.float32) for _ in range(2))
    mask = np.where(np.arange(n) < n - 3, 0, -np.inf).astype(np.float32)  # 3 keys padded
    return q, k, v, mask


def _launched(gpu_runtime):
    return [
        s.kernel for s, _ in gpu_runtime._ptx_cache if isinstance(s, attention_ptx.AttentionGpuSpec)
    ]


@pytest.fixture
def cp(monkeypatch):
    import fake_cupy

    from dlvm_eq.codegen.gpu import gpu_runtime

    monkeypatch.setattr(gpu_runtime, "_ptx_cache", {})  # what this test's program generates
    with fake_cupy.installed(monkeypatch, sms=1) as module:
        yield module


def _line(lines):
    assert len(lines) >= 1, lines
    assert all("predicted fused kernel" in x and "plain program" in x for x in lines), lines
    return lines[0]


@needs_ptxas
def test_a_users_attention_jitted_for_the_gpu_runs_the_fused_kernel(cp):
    from dlvm_eq.codegen.gpu import gpu_runtime

    q, k, v, mask = _inputs(16, 24, 8, 1)
    f = dq.jit(attn, target="gpu")
    got = f(*[cp.asarray(a) for a in (q, k, v, mask)])
    report = f.report(q, k, v, mask).optimize.report["attn"]
    assert "attention" in [i.op for i in f.report(q, k, v, mask).optimize.module["attn"].body]
    assert _line(report.attention).split(":")[1].strip().startswith("fused chosen"), report
    assert _launched(gpu_runtime) == ["forward"]
    q64, k64, v64, m64 = (a.astype(np.float64) for a in (q, k, v, mask))
    want = _softmax64(q64, k64, m64) @ v64
    np.testing.assert_allclose(got.get(), want, rtol=0, atol=2e-5 * np.abs(want).max())


@needs_ptxas
def test_value_and_grad_for_the_gpu_runs_the_fused_backward_kernels(cp):
    """Forward and backward together predicted cheaper fused: the forward kernel, then "dq" and
    "dkv"; the value and the gradients against float64 numpy."""
    from dlvm_eq.codegen.gpu import gpu_runtime

    q, k, v, mask = _inputs(16, 24, 8, 2)
    w = np.random.default_rng(3).standard_normal((2, 16, 8)).astype(np.float32)
    step = dq.jit(dq.value_and_grad(attn_loss, argnums=(0, 1, 2)), target="gpu")
    args = [cp.asarray(a) for a in (q, k, v, mask, w)]
    value, grads = step(*args)
    # the call's own compile (numpy arguments are another signature, whose adjoint comes from
    # the compile cache: its report has no e-graph figures)
    report = step.report(*args)
    ops = planned_ops(step, "attn_loss", *args)
    assert ops.count("attentionBackward") == 3 and "attention" in ops, ops
    lines = attention_lines(report, "attn_loss")
    assert any("fused backward chosen" in x and "plain program" in x for x in lines), lines
    assert _launched(gpu_runtime) == ["forward", "dq", "dkv"]
    q64, k64, v64, m64, w64 = (a.astype(np.float64) for a in (q, k, v, mask, w))
    p = _softmax64(q64, k64, m64)
    dv = np.swapaxes(p, -1, -2) @ w64
    dp = w64 @ np.swapaxes(v64, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * 0.5
    want = [ds @ k64, np.swapaxes(ds, -1, -2) @ q64, dv]
    terms = p @ v64 * w64  # a sum that cancels: a tolerance of its terms' magnitude
    got = float(np.asarray(value.get()))
    np.testing.assert_allclose(got, terms.sum(), rtol=0, atol=1e-6 * np.abs(terms).sum())
    for got, x in zip(grads, want):
        np.testing.assert_allclose(got.get(), x, rtol=0, atol=2e-5 * np.abs(x).max())


@needs_ptxas
def test_few_queries_over_many_keys_keep_the_plain_program_on_the_gpu(cp):
    """Two queries over 2048 keys: the model prices the plain program cheaper (two threads would
    walk every key), so extraction keeps it and no attention kernel is launched."""
    from dlvm_eq.codegen.gpu import gpu_runtime

    q, k, v, mask = _inputs(2, 2048, 16, 4)
    f = dq.jit(attn, target="gpu")
    got = f(*[cp.asarray(a) for a in (q, k, v, mask)])
    report = f.report(q, k, v, mask).optimize
    assert "attention" not in [i.op for i in report.module["attn"].body]
    line = _line(report.report["attn"].attention)
    assert line.split(":")[1].strip().startswith("plain chosen"), line
    assert _launched(gpu_runtime) == []
    q64, k64, v64, m64 = (a.astype(np.float64) for a in (q, k, v, mask))
    want = _softmax64(q64, k64, m64) @ v64
    np.testing.assert_allclose(got.get(), want, rtol=0, atol=2e-5 * np.abs(want).max())
