"""The attention cost model ranked against recorded measurements (issue 33): the fused and the
naive form of the forward and of forward + backward, each program timed as written and priced
as written. No timing here: the figures were measured once and are recorded below.

Recorded with `OPENBLAS_NUM_THREADS=1 DLVM_EQ_NUM_THREADS=1 benchmarks/attention.py --pricing
--seq 256 512 1024 --threads 1 --clock cpu` and `--seq 4096 --calls 3` (batch 1, 4 heads, head
dim 64, float32; median CPU ms of one thread; 2-core AMD EPYC with AVX-512, OpenBLAS
SkylakeX, the forward on its own 512 x 256 tiles and Q Kᵀ through our GEMM, load 2.8 and
3.0-4.4, 2026-12-07, s18-attnprice; the s17-attn record before it, load 7-9.6, ranked the same
pairs but 4096's forward + backward, then 0.93x). Pairs whose measured times lie within NOISE
of each other are not ranked (one-thread CPU time repeats to a few per cent under load).
"""

from __future__ import annotations

import numpy as np
import pytest
from jit_reports import planned_ops
from shipped_cost_model import shipped_cost_model  # noqa: F401 - autouse for this module

import dlvm_eq as dq
from dlvm_eq.egraph.attention_plain import priced_as_written
from dlvm_eq.ir.types import DType, TensorType

# (seq, with backward) -> (fused ms, plain ms), measured
MEASURED = {
    (256, False): (0.90, 0.91),
    (256, True): (3.38, 2.83),
    (512, False): (3.62, 3.93),
    (512, True): (12.75, 11.99),
    (1024, False): (14.53, 15.92),
    (1024, True): (47.80, 47.81),
    (4096, False): (204.52, 280.93),
    (4096, True): (740.28, 843.83),
}
NOISE = 0.08
RANKED = [key for key, (f, p) in MEASURED.items() if abs(f / p - 1) > NOISE]


def _types(seq: int):
    t = TensorType((1, 4, seq, 64), DType.f32)
    return [t, t, t, TensorType((), DType.f32)]


def test_the_recorded_pairs_rank_both_ways():
    """The ranked pairs hold each form's win: a model that always prices one form cheaper
    fails below."""
    winners = {MEASURED[key][0] < MEASURED[key][1] for key in RANKED}
    assert winners == {True, False}, RANKED


@pytest.mark.parametrize("seq, backward", RANKED)
def test_the_cost_model_ranks_fused_and_plain_as_measured(seq, backward):
    attrs = {"scale": 0.125, "causal": 0}
    fused = priced_as_written(_types(seq), attrs, True, backward)
    plain = priced_as_written(_types(seq), attrs, False, backward)
    measured_fused, measured_plain = MEASURED[seq, backward]
    assert (fused < plain) == (measured_fused < measured_plain), (fused, plain)


def loss(q, k, v):
    return dq.sum(dq.softmax((q @ dq.transpose(k, (0, 1, 3, 2))) * 0.125, axis=-1) @ v)


def test_at_seq_256_both_forms_are_priced_plain_and_value_and_grad_stays_plain():
    """At seq 256 the fused forward is no cheaper than the plain program (recorded 0.90 against
    0.91 ms; in s17 three alternating runs of 400 calls, load 11-12: 1.07-1.15 against
    1.06-1.14, fused never below), and fused forward + backward dearer (3.38 against 2.83):
    both are priced plain (before the kernel's per-task cost the forward alone was priced
    12% below plain and extracted fused); from seq 512 the forward alone is priced fused, as
    measured (3.62 against 3.93 ms). value_and_grad keeps the plain program. Gradients against
    float64 numpy."""
    attrs = {"scale": 0.125, "causal": 0}
    for backward in (False, True):
        fused = priced_as_written(_types(256), attrs, True, backward)
        assert fused > priced_as_written(_types(256), attrs, False, backward), backward
    assert priced_as_written(_types(512), attrs, True, False) < priced_as_written(
        _types(512), attrs, False, False
    )
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 4, 256, 64)).astype(np.float32) for _ in range(3))
    step = dq.jit(dq.value_and_grad(loss, argnums=(0, 1, 2)))
    _, grads = step(q, k, v)
    ops = planned_ops(step, "loss", q, k, v)
    assert "attention" not in ops and "attentionBackward" not in ops, ops
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    s = q64 @ np.swapaxes(k64, -1, -2) * 0.125
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dv = np.swapaxes(p, -1, -2) @ np.ones_like(v64)
    ds = p * (
        np.ones_like(q64) @ np.swapaxes(v64, -1, -2)
        - (np.ones_like(q64) * (p @ v64)).sum(-1, keepdims=True)
    )
    want = [ds @ k64 * 0.125, np.swapaxes(ds, -1, -2) @ q64 * 0.125, dv]
    for got, w in zip(grads, want):
        np.testing.assert_allclose(got, w, rtol=0, atol=1e-5 * np.abs(w).max())


def attn(q, k, v):
    return dq.softmax((q @ dq.transpose(k, (0, 1, 3, 2))) * 0.125, axis=-1) @ v


@pytest.mark.parametrize("seq, fused", [(256, False), (512, True)])
def test_the_forward_alone_extracts_the_form_measured_cheaper(seq, fused):
    """jit of the naive forward: plain at seq 256, the fused kernel at 512 (the recorded
    pairs above); either way the result is the float64 formula's."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 4, seq, 64)).astype(np.float32) for _ in range(3))
    f = dq.jit(attn)
    got = f(q, k, v)
    ops = [inst.op for inst in f.report(q, k, v).optimize.module["attn"].body]
    assert ("attention" in ops) == fused, ops
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    s = q64 @ np.swapaxes(k64, -1, -2) * 0.125
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v64
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
