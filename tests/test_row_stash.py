"""Row kernels compute a costly value once per element across their passes
(codegen/kernels/rows.py `early_stash`, kept in a row buffer by cpu/rows_ir.py): softmax's
gradient with the softmax recomputed keeps the exp of its sum pass for the next; a kernel
without a costly shared value keeps nothing; random row programs (max, a costly map, two sums
reading it, outputs reading it again) agree with numpy in float64."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.codegen.kernels.rows import early_stash
from dlvm_eq.codegen.kernels.spec import Unary, walk
from dlvm_eq.codegen.planning.plan import RowStep

RNG = np.random.default_rng(0)


def _row_specs(f, *args):
    return [s.spec for s in f.report(*args).plan.steps if isinstance(s, RowStep)]


def test_softmax_gradient_keeps_its_exp_for_the_next_pass():
    def loss(s, dy):
        return dq.sum(dq.softmax(s * 0.125, axis=-1) * dy)

    x = RNG.standard_normal((6, 40)).astype(np.float32)
    dy = RNG.standard_normal((6, 40)).astype(np.float32)
    f = dq.jit(dq.grad(loss))
    got = f(x, dy)
    (spec,) = _row_specs(f, x, dy)
    _, _, stash = early_stash(spec)
    assert [(k, v.op) for k, v, _ in stash] == [(1, "exp")]  # computed by the sum pass
    z = x.astype(np.float64) * 0.125
    e = np.exp(z - z.max(-1, keepdims=True))
    y = e / e.sum(-1, keepdims=True)
    want = y * (dy - (y * dy).sum(-1, keepdims=True)) * 0.125
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_a_kernel_without_a_costly_shared_value_keeps_nothing_early():
    def norm(x):
        c = x - dq.mean(x, axis=-1, keepdims=True)
        return c * dq.rsqrt(dq.mean(c * c, axis=-1, keepdims=True) + 1e-5)

    x = RNG.standard_normal((5, 48)).astype(np.float32)
    f = dq.jit(norm)
    got = f(x)
    specs = _row_specs(f, x)
    assert specs and all(early_stash(s)[2] == [] for s in specs)
    c = x.astype(np.float64) - x.mean(-1, keepdims=True)
    want = c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


MAPS = {"exp": (dq.exp, np.exp), "tanh": (dq.tanh, np.tanh), "sin": (dq.sin, np.sin)}


@settings(
    deadline=None,
    derandomize=True,
    max_examples=15,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    rows=st.integers(1, 5),
    cols=st.sampled_from([3, 17, 32, 33, 100]),
    fn=st.sampled_from(sorted(MAPS)),
    scale=st.sampled_from([0.5, 1.0, 3.0]),
    seed=st.integers(0, 2**31),
)
def test_random_row_programs_agree_with_float64(rows, cols, fn, scale, seed):
    """m = max(x s); e = f(x s - m); a = sum(e); b = sum(e w / a); out = e (w - b) / a: one row
    kernel of three passes whose later passes and outputs read e again."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    dfn, nfn = MAPS[fn]

    def prog(x, w):
        z = x * scale
        e = dfn(z - dq.max(z, axis=-1, keepdims=True)) + 2.0  # > 0 for every f
        a = dq.sum(e, axis=-1, keepdims=True)
        b = dq.sum(e * w / a, axis=-1, keepdims=True)
        return e * (w - b) / a

    f = dq.jit(prog)
    got = f(x, w)
    z = x.astype(np.float64) * scale
    e = nfn(z - z.max(-1, keepdims=True)) + 2.0
    a = e.sum(-1, keepdims=True)
    b = (e * w / a).sum(-1, keepdims=True)
    want = e * (w - b) / a
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    (spec,) = _row_specs(f, x, w)
    assert len(spec.reductions) == 3
    kept = [n for _, v, _ in early_stash(spec)[2] for n in walk([v])]
    assert any(isinstance(n, Unary) and n.op == fn for n in kept)
