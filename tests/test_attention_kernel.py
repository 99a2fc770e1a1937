"""The fused attention kernel (codegen/runtime/attention_cpu.py) and the `attention` plan step
against the reference interpreter, with scale, padding and causal masks, on random shapes; the
compiled gradients of the naive attention (where rules/attention.egg's backward rule applies)
against float64 central differences."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jit_reports import rules_fired

import dlvm_eq as dq
from dlvm_eq.codegen.runtime import attention_cpu
from dlvm_eq.extract.machine import MACHINES
from dlvm_eq.ir.attention_op import attention as reference
from dlvm_eq.pipeline.native import compile as native_compile


def _reference64(q, k, v, bias, scale, causal):
    args = [np.asarray(a, np.float64) for a in (q, k, v, bias)]
    return reference(args, {"scale": scale, "causal": causal})


@settings(max_examples=25)
@given(
    batch=st.sampled_from([(1,), (2,), (1, 3), (2, 2)]),
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    d=st.integers(1, 9),
    e=st.integers(1, 9),
    mask=st.sampled_from(["none", "padding", "dense"]),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_kernel_matches_the_interpreter(batch, m, n, d, e, mask, causal, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(batch + (m, d)).astype(np.float32) * 2
    k = rng.standard_normal(batch + (n, d)).astype(np.float32) * 2
    v = rng.standard_normal(batch + (n, e)).astype(np.float32)
    if mask == "padding":  # a key-length mask per batch index: -1e9 past a random length
        keep = np.arange(n) < rng.integers(1, n + 1, size=batch + (1, 1))
        bias = np.where(keep, 0.0, -1e9).astype(np.float32)
    elif mask == "dense":
        bias = rng.standard_normal(batch + (m, n)).astype(np.float32)
    else:
        bias = np.float32(0.0)
    scale = 1.0 / np.sqrt(d)
    out = np.full(batch + (m, e), np.nan, np.float32)
    # small blocks, so that a few dozen keys already span several query and key blocks
    attention_cpu.attention_forward(q, k, v, bias, scale, causal, out, threads=2, blocks=(8, 16))
    want = _reference64(q, k, v, bias, scale, causal)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_a_fully_hidden_row_is_nan_as_in_the_naive_formula():
    q = np.ones((1, 2, 3), np.float32)
    bias = np.array([[[-np.inf, -np.inf], [0.0, -np.inf]]], np.float32)
    out = np.zeros((1, 2, 3), np.float32)
    attention_cpu.attention_forward(q, q, q, bias, 1.0, False, out)
    assert np.isnan(out[0, 0]).all() and np.allclose(out[0, 1], 1.0)


def _slow_memory():
    cpu = MACHINES["cpu"]  # writing the scores dominates: extraction takes the fused kernel
    return dataclasses.replace(cpu, name="slow-memory", bandwidth=cpu.bandwidth / 100)


def scaled(q, k, v):
    return dq.softmax((q @ dq.transpose(k, (0, 2, 1))) * 0.125, axis=-1) @ v


def heads_padded(q, k, v, pad):  # rank 4 with a (batch, 1, 1, keys) padding mask
    s = (q @ dq.transpose(k, (0, 1, 3, 2))) * 0.125 + pad
    return dq.softmax(s, axis=-1) @ v


def causal_literal(q, k, v):  # a causal mask as users write it: a constant -1e9 above the diagonal
    hidden = np.triu(np.full((q.shape[1], k.shape[1]), -1e9, np.float32), 1)
    return dq.softmax((q @ dq.transpose(k, (0, 2, 1))) * 0.125 + hidden, axis=-1) @ v


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (scaled, [(2, 300, 16), (2, 700, 16), (2, 700, 8)]),
        (causal_literal, [(2, 300, 16), (2, 600, 16), (2, 600, 8)]),
        (heads_padded, [(2, 2, 130, 8), (2, 2, 520, 8), (2, 2, 520, 8), (2, 1, 1, 520)]),
    ],
)
def test_the_fused_plan_step_matches_the_interpreter(fn, shapes):
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if fn is heads_padded:  # pad the second batch item's last 100 keys
        args[3] = np.zeros(shapes[3], np.float32)
        args[3][1, ..., -100:] = -1e9
    module = dq.make_ir(fn)(*args)
    optimized = dq.optimize(module, target=_slow_memory()).module
    assert "attention" in [inst.op for inst in optimized[fn.__name__].body]
    compiled = native_compile(optimized, fn.__name__, "cpu", optimize=False)
    assert "attention(" in str(compiled.plan)
    got = compiled(*args)
    want = dq.jit(fn, target="interp")(*[a.astype(np.float64) for a in args])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def loss(q, k, v, w):
    return dq.sum(scaled(q, k, v) * w)


def _loss64(q, k, v, w):
    s = q @ np.swapaxes(k, -1, -2) * 0.125
    p = np.exp(s - s.max(-1, keepdims=True))
    return float(np.sum((p / p.sum(-1, keepdims=True)) @ v * w))


def test_gradients_match_float64_finite_differences():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 24, 8)).astype(np.float32) for _ in range(3))
    w = rng.standard_normal((2, 24, 8)).astype(np.float32)
    grads = dq.jit(dq.grad(loss, argnums=(0, 1, 2)))(q, k, v, w)
    args64 = [a.astype(np.float64) for a in (q, k, v, w)]
    for i, g in enumerate(grads):
        u = rng.standard_normal(g.shape)
        eps = 1e-5
        plus, minus = list(args64), list(args64)
        plus[i] = args64[i] + eps * u
        minus[i] = args64[i] - eps * u
        numeric = (_loss64(*plus) - _loss64(*minus)) / (2 * eps)
        assert abs(float(np.sum(g * u)) - numeric) <= 1e-3 * max(1.0, abs(numeric)), i


def test_backward_rowsum_rule_fires_in_value_and_grad():
    """The softmax adjoint's row term rowsum(dO vᵀ * P) becomes rowsum(dO * O) where the
    forward output O is computed too (value_and_grad), and the gradients stay right."""
    rng = np.random.default_rng(3)
    args = [rng.standard_normal((2, 16, 8)).astype(np.float32) for _ in range(4)]
    step = dq.jit(dq.value_and_grad(loss, argnums=(0, 1, 2)))
    value, grads = step(*args)
    report = step.report(*args)
    fired = rules_fired(report, "loss")
    assert fired.get("flash backward 3: rowsum(dP*P)", 0) >= 1, fired
    want_value, want_grads = dq.jit(dq.value_and_grad(loss, argnums=(0, 1, 2)), target="interp")(
        *[a.astype(np.float64) for a in args]
    )
    np.testing.assert_allclose(value, want_value, rtol=1e-5, atol=1e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_vmap_of_the_attention_op_is_a_loop_over_examples():
    """The registry's batching rule: batched q and bias, unbatched k and v."""
    from dlvm_eq.ir import FunctionBuilder, Module
    from dlvm_eq.ir.batching import batch_function
    from dlvm_eq.ir.interp import interpret
    from dlvm_eq.ir.types import DType, TensorType

    f32 = DType.f32
    types = [TensorType(s, f32) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 6), (1, 5))]
    b = FunctionBuilder("f", types, ["q", "k", "v", "pad"])
    f = b.finish(b.emit("attention", list(b.params), scale=0.5, causal=0))
    g, _ = batch_function(f, batched=[True, False, False, True], size=3)
    rng = np.random.default_rng(4)
    q = rng.standard_normal((3, 2, 3, 4)).astype(np.float32)
    k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 5, 4), (2, 5, 6)))
    pad = np.where(rng.random((3, 1, 5)) < 0.3, -1e9, 0).astype(np.float32)
    m = Module("t")
    m.add(g)
    got = interpret(m, g.name, q, k, v, pad)
    want = np.stack(
        [reference([q[i], k, v, pad[i]], {"scale": 0.5, "causal": 0}) for i in range(3)]
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


ATTENTION_TEXT = """module "a"
stage raw
func @f: (<2 x 4 x 8 x f64>, <2 x 6 x 8 x f64>, <2 x 6 x 8 x f64>) -> <2 x 4 x 8 x f64> {
'entry(%q: <2 x 4 x 8 x f64>, %k: <2 x 6 x 8 x f64>, %v: <2 x 6 x 8 x f64>):
    %o = attention %q: <2 x 4 x 8 x f64>, %k: <2 x 6 x 8 x f64>, %v: <2 x 6 x 8 x f64>, 0.0: f64 scale 0.3 causal
    return %o: <2 x 4 x 8 x f64>
}
"""


def test_the_attention_op_parses_prints_back_and_runs_as_the_naive_formula():
    from dlvm_eq.ir import interpret
    from dlvm_eq.ir.parser import parse

    m = parse(ATTENTION_TEXT)
    assert str(parse(str(m))) == str(m)  # the printed op reads back to the same op
    rng = np.random.default_rng(3)
    q, k, v = (
        rng.standard_normal((2, 4, 8)),
        rng.standard_normal((2, 6, 8)),
        rng.standard_normal((2, 6, 8)),
    )
    s = q @ k.transpose(0, 2, 1) * 0.3
    s = np.where(np.arange(6)[None, :] > np.arange(4)[:, None], -np.inf, s)  # causal: j > i hidden
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(interpret(m, "f", q, k, v), want, rtol=1e-12)
