"""The attention cost model ranked against recorded measurements (issue 33): the fused and the
naive form of the forward and of forward + backward, each program timed as written and priced
as written. No timing here: the figures were measured once and are recorded below.

Recorded with `benchmarks/attention.py --pricing --seq 256 1024 --threads 1 --clock cpu` and
`--seq 4096 --calls 3` (batch 1, 4 heads, head dim 64, float32; median CPU ms of one thread;
2-core AMD EPYC, load 6.8-8.5, 2026-12-07). Pairs whose measured times lie within NOISE of
each other are not ranked (one-thread CPU time repeats to a few per cent under that load).
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
    (256, False): (1.12, 1.10),
    (256, True): (3.95, 3.49),
    (1024, False): (15.79, 19.09),
    (1024, True): (53.31, 55.07),
    (4096, False): (263.89, 296.67),
    (4096, True): (852.62, 864.14),
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


def test_a_differentiated_attention_is_decided_by_forward_and_backward_together():
    """At seq 256 the fused forward alone is predicted cheaper, but the fused forward and
    backward dearer than the naive program and its reverse pass (measured: 3.95 against 3.49
    ms): value_and_grad keeps the plain program. Gradients against float64 numpy."""
    attrs = {"scale": 0.125, "causal": 0}
    types = _types(256)
    assert priced_as_written(types, attrs, True, False) < priced_as_written(
        types, attrs, False, False
    )
    assert priced_as_written(types, attrs, True, True) > priced_as_written(
        types, attrs, False, True
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
