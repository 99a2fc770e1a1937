"""The fused attention kernel on the GPU (codegen/gpu/attention_ptx.py, attention_gpu.py): its
PTX assembled by ptxas for sm_75, sm_80 and sm_90; the kernel run on the emulated GPU
(tests/fake_cupy.py: each CTA's threads on host threads, shared memory and barriers real)
against the interpreter's formula in float64 on random small shapes with scale, causal, padding
and dense masks; the gpu program's `attention` step launching it. Tests marked `gpu` run it on a
device where one works (scripts/gpu-check)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlvm_eq.codegen.gpu.attention_gpu import attention_spec, bias_strides
from dlvm_eq.codegen.gpu.attention_ptx import (
    KEY_BLOCK,
    QUERY_BLOCK,
    SHARED_BYTES,
    attention_ptx_ir,
)
from dlvm_eq.codegen.gpu.llvm_ptx import compile_ptx
from dlvm_eq.ir.attention_op import attention as reference
from dlvm_eq.ir.types import DType, TensorType

PTXAS = shutil.which("ptxas")
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="ptxas is not on PATH")


def _reference64(q, k, v, bias, scale, causal):
    args = [np.asarray(a, np.float64) for a in (q, k, v, bias)]
    return reference(args, {"scale": scale, "causal": causal})


def _lse64(q, k, bias, scale, causal):
    """Each score row's log-sum-exp in float64 (-inf where every key is hidden)."""
    s = np.asarray(q, np.float64) @ np.swapaxes(np.asarray(k, np.float64), -1, -2) * scale
    s = s + np.asarray(bias, np.float64)
    if causal:
        s = np.where(np.arange(s.shape[-1])[None, :] > np.arange(s.shape[-2])[:, None], -np.inf, s)
    top = s.max(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        shift = np.where(np.isfinite(top), top, 0)
        return (shift + np.log(np.exp(s - shift).sum(-1, keepdims=True)))[..., 0]


def test_bias_strides_broadcast_over_batch_rows_and_keys():
    assert bias_strides((), (2, 3, 4, 5)) == (0, 0, 0, 0)
    assert bias_strides((5,), (4, 5)) == (0, 0, 0, 1)
    assert bias_strides((2, 1, 1, 5), (2, 3, 4, 5)) == (5, 0, 0, 1)
    assert bias_strides((3, 4, 5), (2, 3, 4, 5)) == (0, 20, 5, 1)
    assert bias_strides((4, 1), (7, 4, 5)) == (0, 0, 1, 0)


def test_wide_heads_get_a_smaller_tile_within_the_shared_memory_budget():
    def spec(d, dtype, kernel="forward"):
        shapes = (2, 100, d), (2, 100, d), (2, 100, d)
        return dataclasses.replace(attention_spec(*shapes, (), 1.0, False, dtype), kernel=kernel)

    for s in (spec(64, "f32"), spec(256, "f64"), spec(64, "f32", "dkv"), spec(256, "f64", "dkv")):
        itemsize = 4 if s.dtype == "f32" else 8
        assert s.shared_elements() * itemsize <= SHARED_BYTES
    assert spec(256, "f64").tile_rows() < spec(64, "f32").tile_rows() == KEY_BLOCK


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
@pytest.mark.parametrize(
    "dtype, causal, d, e, bias",
    [("f32", False, 64, 64, (0, 0, 0, 0)), ("f32", True, 64, 64, (8, 0, 0, 1)),
     ("f64", True, 160, 32, (0, 0, 512, 1))],
)  # fmt: skip
def test_the_ptx_assembles_with_ptxas(arch, dtype, causal, d, e, bias, tmp_path):
    spec = attention_spec((2, 4, 300, d), (2, 4, 512, d), (2, 4, 512, e), (), 0.125, causal, dtype)
    for kernel in ("forward", "dq", "dkv"):
        spec = dataclasses.replace(spec, bias_strides=bias, kernel=kernel)
        ptx = compile_ptx(attention_ptx_ir(spec, arch)[0], arch)
        assert "bar.sync" in ptx and ".shared" in ptx  # tiles go through shared memory
        src = tmp_path / f"{kernel}.ptx"
        src.write_text(ptx)
        r = subprocess.run(
            [PTXAS, f"-arch={arch}", str(src), "-o", str(tmp_path / f"{kernel}.cubin")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr


def _run_emulated(monkeypatch, q, k, v, bias, scale, causal, blocks):
    import fake_cupy

    from dlvm_eq.codegen.gpu.attention_gpu import DTYPE_NAMES, GpuAttentionKernel

    dtype = DTYPE_NAMES[q.dtype]
    spec = attention_spec(q.shape, k.shape, v.shape, np.shape(bias), scale, causal, dtype)
    spec = dataclasses.replace(spec, query_block=blocks[0], key_block=blocks[1])
    with fake_cupy.installed(monkeypatch, sms=1) as cp:
        out = cp.asarray(np.full(q.shape[:-1] + (v.shape[-1],), np.nan, q.dtype))
        lse = cp.asarray(np.full(q.shape[:-1], np.nan, q.dtype))
        args = [cp.asarray(np.ascontiguousarray(a, q.dtype)) for a in (q, k, v, bias)]
        GpuAttentionKernel(spec).run(out, lse, *args)
    return np.asarray(out), np.asarray(lse)


@needs_ptxas  # fake_cupy assembles what it loads
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=st.sampled_from([(), (2,), (1, 2), (2, 2)]),
    m=st.integers(1, 7),
    n=st.integers(1, 9),
    d=st.integers(1, 5),
    e=st.integers(1, 5),
    mask=st.sampled_from(["none", "padding", "dense"]),
    causal=st.booleans(),
    blocks=st.sampled_from([(2, 2), (3, 4), (4, 3), (QUERY_BLOCK, 32)]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_the_emulated_kernel_matches_the_interpreter(
    monkeypatch, batch, m, n, d, e, mask, causal, blocks, dtype, seed
):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal(batch + (m, d)) * 2).astype(dtype)
    k = (rng.standard_normal(batch + (n, d)) * 2).astype(dtype)
    v = rng.standard_normal(batch + (n, e)).astype(dtype)
    if mask == "padding":  # a key-length mask per batch index: -inf past a random length
        keep = np.arange(n) < rng.integers(1, n + 1, size=batch + (1, 1))
        bias = np.where(keep, 0.0, -np.inf).astype(dtype)
    elif mask == "dense":
        bias = rng.standard_normal(batch + (m, n)).astype(dtype)
    else:
        bias = np.array(0.25, dtype)
    scale = 1.0 / np.sqrt(d)
    out, lse = _run_emulated(monkeypatch, q, k, v, bias, scale, causal, blocks)
    want = _reference64(q, k, v, bias, scale, causal)
    want_lse = _lse64(q, k, bias, scale, causal)
    # float32 inputs: the kernel's rounding, relative to the output's magnitude
    tol = (2e-5 if dtype == np.float32 else 1e-12) * max(1.0, np.abs(want).max())
    np.testing.assert_allclose(out, want, rtol=0, atol=tol)
    tol = (2e-5 if dtype == np.float32 else 1e-12) * max(1.0, np.abs(want_lse).max())
    np.testing.assert_allclose(lse, want_lse, rtol=0, atol=tol)


def _run_backward_emulated(monkeypatch, q, k, v, bias, o, g, scale, causal, blocks):
    """dQ, dK, dV through the three kernels, as attention_backward_gpu_run launches them."""
    import fake_cupy

    from dlvm_eq.codegen.gpu.attention_gpu import DTYPE_NAMES, GpuAttentionKernel

    dtype = DTYPE_NAMES[q.dtype]
    base = attention_spec(q.shape, k.shape, v.shape, np.shape(bias), scale, causal, dtype)
    base = dataclasses.replace(base, query_block=blocks[0], key_block=blocks[1])
    with fake_cupy.installed(monkeypatch, sms=1) as cp:
        q, k, v, bias, o, g = (
            cp.asarray(np.ascontiguousarray(a, q.dtype)) for a in (q, k, v, bias, o, g)
        )
        lse = cp.empty(q.shape[:-1], q.dtype)
        GpuAttentionKernel(base).run(cp.empty(o.shape, q.dtype), lse, q, k, v, bias)
        grads = [cp.asarray(np.full(a.shape, np.nan, q.dtype)) for a in (q, k, v)]
        delta = cp.empty(q.shape[:-1], q.dtype)
        dq = GpuAttentionKernel(dataclasses.replace(base, kernel="dq"))
        dq.run_with(grads[0], delta, q, k, v, bias, o, g, lse)
        dkv = GpuAttentionKernel(dataclasses.replace(base, kernel="dkv"))
        dkv.run_with(grads[1], grads[2], q, k, v, bias, g, lse, delta)
    return [np.asarray(a) for a in grads]


@needs_ptxas
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=st.sampled_from([(), (2,), (1, 2)]),
    m=st.integers(1, 7),
    n=st.integers(1, 8),
    d=st.integers(1, 4),
    e=st.integers(1, 4),
    mask=st.sampled_from(["none", "padding", "dense"]),
    causal=st.booleans(),
    blocks=st.sampled_from([(2, 2), (3, 4), (4, 3)]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_the_emulated_backward_kernels_match_the_interpreter(
    monkeypatch, batch, m, n, d, e, mask, causal, blocks, dtype, seed
):
    """dQ, dK and dV against the reference adjoint (ir/attention_op.attention_backward) in
    float64, with o the forward's output (as in a gradient) and every row seeing a key."""
    from dlvm_eq.ir.attention_op import attention_backward

    rng = np.random.default_rng(seed)
    q = (rng.standard_normal(batch + (m, d)) * 2).astype(dtype)
    k = (rng.standard_normal(batch + (n, d)) * 2).astype(dtype)
    v = rng.standard_normal(batch + (n, e)).astype(dtype)
    g = rng.standard_normal(batch + (m, e)).astype(dtype)
    if mask == "padding":
        keep = np.arange(n) < rng.integers(1, n + 1, size=batch + (1, 1))
        bias = np.where(keep, 0.0, -np.inf).astype(dtype)
    elif mask == "dense":
        bias = rng.standard_normal(batch + (m, n)).astype(dtype)
    else:
        bias = np.array(-0.5, dtype)
    scale = 1.0 / np.sqrt(d)
    o = _reference64(q, k, v, bias, scale, causal).astype(dtype)
    got = _run_backward_emulated(monkeypatch, q, k, v, bias, o, g, scale, causal, blocks)
    args64 = [np.asarray(a, np.float64) for a in (q, k, v, bias, o, g)]
    for wrt, grad in enumerate(got):
        want = attention_backward(args64, {"scale": scale, "causal": causal, "wrt": wrt})
        tol = (5e-5 if dtype == np.float32 else 1e-11) * max(1.0, np.abs(want).max())
        np.testing.assert_allclose(grad, want, rtol=0, atol=tol, err_msg=f"wrt {wrt}")


@needs_ptxas
def test_a_head_dim_above_the_unroll_limit_runs_its_loops(monkeypatch):
    """Head dims above UNROLL are loops, not straight-line code: the same results."""
    from dlvm_eq.codegen.gpu.attention_ptx import UNROLL
    from dlvm_eq.ir.attention_op import attention_backward

    rng = np.random.default_rng(8)
    d = UNROLL + 3
    q, k = rng.standard_normal((3, d)) * 0.2, rng.standard_normal((5, d)) * 0.2
    v, g = rng.standard_normal((5, 2)), rng.standard_normal((3, 2))
    bias = np.zeros(())
    out, _ = _run_emulated(monkeypatch, q, k, v, bias, 0.5, True, (2, 2))
    want = _reference64(q, k, v, bias, 0.5, True)
    np.testing.assert_allclose(out, want, rtol=1e-12)
    grads = _run_backward_emulated(monkeypatch, q, k, v, bias, want, g, 0.5, True, (2, 2))
    for wrt, grad in enumerate(grads):
        w = attention_backward([q, k, v, bias, want, g], {"scale": 0.5, "causal": 1, "wrt": wrt})
        np.testing.assert_allclose(grad, w, rtol=0, atol=1e-12 * np.abs(w).max())


@needs_ptxas
def test_a_fully_hidden_row_is_nan_and_its_lse_minus_inf(monkeypatch):
    """As the naive formula and the CPU kernel: 0/0 for a row that sees no key; a row whose
    first key tile is hidden and a later one not is still right (its shift stays finite)."""
    q = np.ones((1, 3, 2))
    k, v = np.ones((1, 5, 2)), np.arange(10.0).reshape(1, 5, 2)
    bias = np.zeros((1, 3, 5))
    bias[0, 0, :] = -np.inf
    bias[0, 1, :3] = -np.inf  # the first tile of two keys hidden, and one of the second
    out, lse = _run_emulated(monkeypatch, q, k, v, bias, 1.0, False, (2, 2))
    assert np.isnan(out[0, 0]).all() and lse[0, 0] == -np.inf
    want = _reference64(q, k, v, bias, 1.0, False)
    np.testing.assert_allclose(out[0, 1:], want[0, 1:], rtol=1e-13)
    np.testing.assert_allclose(lse[0, 1:], _lse64(q, k, bias, 1.0, False)[0, 1:], rtol=1e-13)


def _attention_module(shapes, causal, dtype=DType.f32):
    """A function holding the fused op and its three adjoints, as extraction leaves a
    value_and_grad (dV's node reads g in o's place: rules/attention_adjoint.egg)."""
    from dlvm_eq.ir import FunctionBuilder, Module

    types = [TensorType(s, dtype) for s in shapes]
    b = FunctionBuilder("f", types, ["q", "k", "v", "pad", "g"])
    q, k, v, pad, g = b.params
    attrs = {"scale": 0.5, "causal": int(causal)}
    o = b.emit("attention", [q, k, v, pad], **attrs)
    grads = [b.emit("attentionBackward", [q, k, v, pad, o, g], wrt=w, **attrs) for w in (0, 1)]
    grads.append(b.emit("attentionBackward", [q, k, v, pad, g, g], wrt=2, **attrs))
    module = Module("t")
    module.add(b.finish([o, *grads]))
    return module


def _backward_module(shapes, dtype=DType.f32):
    """dQ, dK and dV with o a parameter: no forward step to take the log-sum-exp from."""
    from dlvm_eq.ir import FunctionBuilder, Module

    types = [TensorType(s, dtype) for s in shapes]
    b = FunctionBuilder("f", types, ["q", "k", "v", "pad", "o", "g"])
    q, k, v, pad, o, g = b.params
    attrs = {"scale": 0.5, "causal": 0}
    grads = [b.emit("attentionBackward", [q, k, v, pad, o, g], wrt=w, **attrs) for w in (0, 1)]
    grads.append(b.emit("attentionBackward", [q, k, v, pad, g, g], wrt=2, **attrs))
    module = Module("t")
    module.add(b.finish(grads))
    return module


@needs_ptxas
def test_a_backward_step_without_its_forward_gets_the_lse_from_the_forward_kernel(monkeypatch):
    import fake_cupy

    from dlvm_eq.codegen.gpu import gpu_runtime
    from dlvm_eq.codegen.gpu.attention_ptx import AttentionGpuSpec
    from dlvm_eq.ir import interpret
    from dlvm_eq.pipeline.native import compile as native_compile

    shapes = [(2, 5, 3), (2, 6, 3), (2, 6, 2), (1, 6), (2, 5, 2), (2, 5, 2)]
    rng = np.random.default_rng(7)
    args = [rng.standard_normal(s) for s in shapes]
    args[3] = np.where(np.arange(6) < 4, 0.0, -np.inf)[None, :]
    args[4] = _reference64(*args[:4], 0.5, False)  # o: the forward's output
    args32 = [a.astype(np.float32) for a in args]
    monkeypatch.setattr(gpu_runtime, "_ptx_cache", {})  # what this test's program generates
    with fake_cupy.installed(monkeypatch, sms=1) as cp:
        compiled = native_compile(_backward_module(shapes), "f", "gpu", optimize=False)
        got = compiled(*[cp.asarray(a) for a in args32])
    launched = [s.kernel for s, _ in gpu_runtime._ptx_cache if isinstance(s, AttentionGpuSpec)]
    assert launched == ["forward", "dq", "dkv"]  # lse from the forward kernel, o not rewritten
    want = interpret(_backward_module(shapes, DType.f64), "f", *[a.astype(float) for a in args32])
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=0, atol=2e-5 * np.abs(w).max())


@needs_ptxas
@pytest.mark.parametrize("causal", [False, True])
def test_the_gpu_programs_attention_step_launches_the_fused_kernel(monkeypatch, causal):
    """A function whose extraction chose the fused op, compiled for the gpu target (emulated):
    its `attention` step runs the forward PTX kernel, which also writes the log-sum-exp slot
    the backward step reads; the backward step runs the "dq" and "dkv" kernels; every result
    is the interpreter's in float64."""
    import fake_cupy

    from dlvm_eq.codegen.gpu import gpu_runtime
    from dlvm_eq.codegen.gpu.attention_ptx import AttentionGpuSpec
    from dlvm_eq.codegen.planning.attention import AttentionStep
    from dlvm_eq.ir import interpret
    from dlvm_eq.pipeline.native import compile as native_compile

    shapes = [(2, 2, 9, 4), (2, 2, 11, 4), (2, 2, 11, 3), (2, 1, 1, 11), (2, 2, 9, 3)]
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    args[3] = np.where(np.arange(11) < np.array([11, 6]).reshape(2, 1, 1, 1), 0, -np.inf)
    args[3] = args[3].astype(np.float32)  # the second batch item's last 5 keys padded
    module = _attention_module(shapes, causal)
    monkeypatch.setattr(gpu_runtime, "_ptx_cache", {})  # what this test's program generates
    with fake_cupy.installed(monkeypatch, sms=1) as cp:
        compiled = native_compile(module, "f", "gpu", optimize=False)
        got = compiled(*[cp.asarray(a) for a in args])
    forward = [s for s in compiled.plan.steps if isinstance(s, AttentionStep) and not s.grads]
    assert forward and forward[0].lse >= 0  # the forward writes the row lse too
    launched = [s for s, _ in gpu_runtime._ptx_cache if isinstance(s, AttentionGpuSpec)]
    assert [(s.kernel, s.batch, s.m, s.bias_strides, s.causal) for s in launched] == [
        (kernel, (2, 2), 9, (11, 0, 0, 1), causal) for kernel in ("forward", "dq", "dkv")
    ]
    # the same function in float64, interpreted: the oracle
    want = interpret(
        _attention_module(shapes, causal, DType.f64), "f", *[a.astype(np.float64) for a in args]
    )
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=0, atol=2e-5 * np.abs(w).max())


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_the_kernels_on_a_gpu_match_float64(causal):
    from dlvm_eq.codegen.gpu.attention_gpu import GpuAttentionKernel
    from dlvm_eq.codegen.gpu.gpu_runtime import cupy_module, gpu_available
    from dlvm_eq.ir.attention_op import attention_backward

    if not gpu_available():
        pytest.skip("no usable CUDA device")
    cp = cupy_module()
    rng = np.random.default_rng(6)
    q, k, v, g = (rng.standard_normal((2, 4, 300, 64)).astype(np.float32) for _ in range(4))
    bias = np.where(rng.random((2, 1, 1, 300)) < 0.1, -np.inf, 0).astype(np.float32)
    bias[..., 0] = 0  # every row sees a key
    spec = attention_spec(q.shape, k.shape, v.shape, bias.shape, 0.125, causal, "f32")
    dev = [cp.asarray(a) for a in (q, k, v, bias, g)]
    out, lse = cp.empty(q.shape, cp.float32), cp.empty(q.shape[:-1], cp.float32)
    GpuAttentionKernel(spec).run(out, lse, *dev[:4])
    grads = [cp.empty(a.shape, cp.float32) for a in (q, k, v)]
    delta = cp.empty(q.shape[:-1], cp.float32)
    dq = GpuAttentionKernel(dataclasses.replace(spec, kernel="dq"))
    dq.run_with(grads[0], delta, *dev[:4], out, dev[4], lse)
    dkv = GpuAttentionKernel(dataclasses.replace(spec, kernel="dkv"))
    dkv.run_with(grads[1], grads[2], *dev[:4], dev[4], lse, delta)
    want = _reference64(q, k, v, bias, 0.125, causal)
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=0, atol=2e-5 * np.abs(want).max())
    want_lse = _lse64(q, k, bias, 0.125, causal)
    np.testing.assert_allclose(cp.asnumpy(lse), want_lse, rtol=2e-5)
    args64 = [np.asarray(a, np.float64) for a in (q, k, v, bias, want, g)]
    for wrt, grad in enumerate(grads):
        w = attention_backward(args64, {"scale": 0.125, "causal": causal, "wrt": wrt})
        np.testing.assert_allclose(cp.asnumpy(grad), w, rtol=0, atol=5e-5 * np.abs(w).max())


@needs_ptxas
def test_operands_behind_views_reach_the_kernel_as_their_values(monkeypatch):
    """k given as (batch, d, n) and transposed in the function: the step reads it through a
    view, which the runner makes contiguous; the bias is a vector over the keys."""
    import fake_cupy

    from dlvm_eq.ir import FunctionBuilder, Module, interpret
    from dlvm_eq.pipeline.native import compile as native_compile

    def module(dtype):
        shapes = [(2, 5, 3), (2, 3, 6), (2, 6, 4), (6,)]
        b = FunctionBuilder("f", [TensorType(s, dtype) for s in shapes], ["q", "kt", "v", "pad"])
        q, kt, v, pad = b.params
        k = b.emit("transpose", [kt], perm=(0, 2, 1))
        m = Module("t")
        m.add(b.finish(b.emit("attention", [q, k, v, pad], scale=0.7, causal=1)))
        return m

    rng = np.random.default_rng(9)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(2, 5, 3), (2, 3, 6), (2, 6, 4)]]
    args.append(np.array([0, 0, -np.inf, 0, 0, -1], np.float32))
    with fake_cupy.installed(monkeypatch, sms=1) as cp:
        compiled = native_compile(module(DType.f32), "f", "gpu", optimize=False)
        got = compiled(*[cp.asarray(a) for a in args])
    want = interpret(module(DType.f64), "f", *[a.astype(float) for a in args])
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-5 * np.abs(want).max())
