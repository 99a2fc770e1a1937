"""Causal masks written from iotas (issue 33), JAX's spelling `arange(T)[:, None] >=
arange(T)[None, :]` used in `where(mask, scores, -inf)`: the loader computes a comparison of
literals (egraph/loader.py), so the mask is the bool causal literal rules/attention.egg turns
into the kernel's causal mode. Look-alikes (the diagonal hidden too) keep their mask as a
selection. Values against float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq

T = 1024  # the shipped defaults price the fused kernel below the plain program here


def _attn(compare):
    def attn(q, k, v):
        s = (q @ dq.transpose(k, (0, 1, 3, 2))) * 0.25
        keep = compare(dq.arange(T)[:, None], dq.arange(T)[None, :])
        return dq.softmax(dq.where(keep, s, -np.inf), axis=-1) @ v

    return attn


def _want(q, k, v, keep):
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * 0.25
    s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize(
    "compare, causal",
    [
        (dq.greater_equal, True),  # query i >= key j: keep the diagonal and below
        (lambda a, b: dq.less_equal(b, a), True),  # the same, written the other way round
        (dq.greater, False),  # strictly below: the diagonal hidden too, not causal mode
    ],
)
def test_iota_comparison_masks(compare, causal):
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 2, T, 16)).astype(np.float32) for _ in range(3))
    fn = _attn(compare)
    step = dq.jit(fn)
    got = step(q, k, v)
    lines = step.report(q, k, v).optimize.report["attn"].attention
    assert any("fused chosen" in line and "(causal mode)" in line for line in lines) == causal
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    keep = i >= j if causal else i > j
    want = _want(q, k, v, keep)
    ok = np.isfinite(want)  # row 0 of the strict mask sees no key: NaN, as the naive formula
    np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=1e-5 * np.abs(want[ok]).max())
