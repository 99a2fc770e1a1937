"""Causal masks as users write them (an additive -1e9 or -inf literal, or where(tril(ones),
scores, -inf)), on random shapes and spellings (hypothesis): rules/attention.egg turns each into
the fused kernel's causal mode (taken by extraction on a machine of slow plan steps), and the compiled
program agrees with the reference interpreter in float64 on the program as written."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.extract.machine import MACHINES
from dlvm_eq.pipeline.native import compile as native_compile


def _slow_steps():
    """The shipped CPU machine with a millisecond per plan step and a hundredth of its
    bandwidth: the plain program's steps and scores dominate at every size tested, so
    extraction takes the one-step fused kernel and the test runs it."""
    cpu = MACHINES["cpu"]
    return dataclasses.replace(cpu, name="slow-steps", launch=1e-3, bandwidth=cpu.bandwidth / 100)


def _program(spelling: str, scale_on_q: bool, scale: float):
    def scores(q, k):
        if scale_on_q:
            return (q * scale) @ dq.transpose(k, (0, 2, 1))
        return (q @ dq.transpose(k, (0, 2, 1))) * scale

    def attn(q, k, v):
        m, n = q.shape[1], k.shape[1]
        if spelling == "where":
            keep = np.tril(np.ones((m, n), bool))
            s = dq.where(keep, scores(q, k), -np.inf)
        else:
            hidden = -1e9 if spelling == "bias -1e9" else -np.inf
            s = scores(q, k) + np.triu(np.full((m, n), hidden, np.float32), 1)
        return dq.softmax(s, axis=-1) @ v

    return attn


@settings(max_examples=8, deadline=None)
@given(
    batch=st.integers(1, 3),
    m=st.integers(2, 24),
    extra_keys=st.integers(0, 8),
    d=st.integers(1, 8),
    spelling=st.sampled_from(["bias -1e9", "bias -inf", "where"]),
    scale_on_q=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_causal_spellings_compile_to_the_causal_kernel(
    batch, m, extra_keys, d, spelling, scale_on_q, seed
):
    n = m + extra_keys
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, m, d)).astype(np.float32)
    k = rng.standard_normal((batch, n, d)).astype(np.float32)
    v = rng.standard_normal((batch, n, d)).astype(np.float32)
    fn = _program(spelling, scale_on_q, 0.5)
    module = dq.make_ir(fn)(q, k, v)
    res = dq.optimize(module, target=_slow_steps())
    optimized = res.module
    fired = res.report["attn"].saturation.rule_matches
    causal_rules = [
        r for r, n in fired.items() if n and ("causal bias" in r or "where(causal" in r)
    ]
    assert causal_rules, fired  # the mask reached the causal mode in the e-graph
    att = [inst for inst in optimized["attn"].body if inst.op == "attention"]
    assert [inst.attrs["causal"] for inst in att] == [1], str(optimized)  # no mask as a bias
    got = native_compile(optimized, "attn", "cpu", optimize=False)(q, k, v)
    want = dq.jit(fn, target="interp")(*(a.astype(np.float64) for a in (q, k, v)))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
