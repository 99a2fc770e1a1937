"""Products written straight into their reader's layout (codegen/planning/product_layout.py):
the head merge of attention and of its adjoints needs no copy kernel; the pass leaves a product
alone where another step reads it, where the permutation moves an entry's contiguous axis
into the batch, and for 2-D products; random batched products with transposed operands, a
permuted result and a softmax agree with numpy in float64 and, for the gradient, with the
reference interpreter (the unoptimized program)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.codegen.kernels.kernel_spec import KernelSpec
from dlvm_eq.codegen.kernels.spec import Load
from dlvm_eq.codegen.planning.plan import BlasStep, KernelStep
from dlvm_eq.codegen.runtime import gemm_runtime

B, T, H, HD = 2, 8, 3, 4
D = H * HD
RNG = np.random.default_rng(0)


def _copies(plan) -> int:
    """Kernels of the plan that only copy (every output a Load)."""
    return sum(
        isinstance(s, KernelStep)
        and isinstance(s.spec, KernelSpec)
        and all(isinstance(o, Load) for o in s.spec.outputs)
        for s in plan.steps
    )


def _written(plan) -> int:
    return sum(isinstance(s, BlasStep) and s.out_view is not None for s in plan.steps)


def _heads(t):
    return dq.transpose(dq.reshape(t, (B, T, H, HD)), (0, 2, 1, 3))


def attention(x, wq, wk, wv, wo):
    q, k, v = _heads(x @ wq), _heads(x @ wk), _heads(x @ wv)
    attn = dq.softmax((q @ dq.transpose(k, (0, 1, 3, 2))) * (1.0 / np.sqrt(HD)), axis=-1)
    ctx = dq.reshape(dq.transpose(attn @ v, (0, 2, 1, 3)), (B, T, D))
    return dq.sum(dq.tanh(ctx @ wo))


def _np_attention(x, wq, wk, wv, wo):
    def heads(t):
        return t.reshape(B, T, H, HD).transpose(0, 2, 1, 3)

    q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HD)
    e = np.exp(s - s.max(-1, keepdims=True))
    ctx = ((e / e.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
    return np.tanh(ctx @ wo).sum()


def _attention_args():
    x = RNG.standard_normal((B, T, D)).astype(np.float32)
    ws = [(RNG.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for _ in range(4)]
    return [x, *ws]


@pytest.fixture(params=[False, True], ids=["numpy-matmul", "our-gemm"])
def gemm_floor(request, monkeypatch):
    """Batched products through numpy (the shipped default's floor) or all through our GEMM."""
    if request.param:
        monkeypatch.setattr(gemm_runtime, "GEMM_MIN_MACS", 1)
    return request.param


def test_head_merge_is_written_by_its_product(gemm_floor):
    args = _attention_args()
    f = dq.jit(attention)
    got = f(*args)
    report = f.report(*args)
    assert _copies(report.plan) == 0 and _written(report.plan) == 1
    assert "products written in their reader's layout (no copy): " in str(report)
    want = _np_attention(*[a.astype(np.float64) for a in args])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * abs(want))


def test_the_adjoints_head_merges_are_written_by_their_products(gemm_floor):
    """value_and_grad: the forward's merge and dQ, dK, dV's (dK's product is kᵀ's adjoint,
    column-major entries in the merged layout) are all written in place; the gradient equals
    the reference interpreter's in float64 terms."""
    args = _attention_args()
    f = dq.jit(dq.value_and_grad(attention, argnums=(0, 1, 2, 3, 4)))
    value, grads = f(*args)
    plan = f.report(*args).plan
    assert _copies(plan) == 0 and _written(plan) == 4
    ref_value, ref = dq.jit(dq.value_and_grad(attention, argnums=(0, 1, 2, 3, 4)), target="interp")(
        *[a.astype(np.float64) for a in args]
    )
    np.testing.assert_allclose(value, ref_value, rtol=1e-4, atol=1e-5 * abs(ref_value))
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4 * np.abs(r).max())


def _product_then(perm, also_read=False):
    """a @ b (2, 3, 5, 6), permuted by `perm` and flattened to a matrix for a product: the
    flattening needs the permuted layout in memory, a copy unless the product writes it."""

    def f(a, b, w):
        p = a @ b
        y = dq.transpose(p, perm)
        y = dq.reshape(y, (y.shape[0] * y.shape[1], -1)) @ w
        out = dq.sum(dq.tanh(y))
        return out + dq.sum(p * p) if also_read else out

    return f


@pytest.mark.parametrize(
    "perm, also_read, written",
    [
        ((0, 2, 1, 3), False, 1),  # the head merge: row-major entries
        ((1, 3, 0, 2), False, 1),  # an entry's rows innermost: column-major entries
        ((0, 2, 1, 3), True, 0),  # the product is read again: its own buffer stays
        ((2, 3, 1, 0), False, 0),  # a batch axis innermost: no unit stride in an entry
    ],
)
def test_fires_only_where_the_product_is_the_copys_alone(perm, also_read, written):
    a = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
    b = RNG.standard_normal((2, 3, 4, 6)).astype(np.float32)
    shape = tuple((2, 3, 5, 6)[d] for d in perm)
    w = RNG.standard_normal((int(np.prod(shape[2:])), 3)).astype(np.float32)
    fn = _product_then(perm, also_read=also_read)
    f = dq.jit(fn)
    got = f(a, b, w)
    plan = f.report(a, b, w).plan
    assert (_written(plan), _copies(plan)) == (written, 1 - written)
    want = dq.jit(fn, target="interp")(*(x.astype(np.float64) for x in (a, b, w)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * abs(want))


def test_a_two_dimensional_product_keeps_its_copy():
    a = RNG.standard_normal((5, 4)).astype(np.float32)
    b = RNG.standard_normal((4, 6)).astype(np.float32)

    def f(a, b):
        return dq.reshape(dq.transpose(a @ b, (1, 0)), (-1,))

    jf = dq.jit(f)
    np.testing.assert_array_equal(jf(a, b), (a @ b).T.reshape(-1))
    assert _written(jf.report(a, b).plan) == 0


PERMS4 = list(itertools.permutations(range(4)))


@settings(
    deadline=None,
    derandomize=True,
    max_examples=20,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    batch=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    m=st.integers(1, 7),
    k=st.integers(1, 6),
    n=st.integers(1, 7),
    ta=st.booleans(),
    tb=st.booleans(),
    perm=st.sampled_from(PERMS4),
    softmax=st.booleans(),
    ours=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_random_products_in_any_layout_agree_with_the_oracles(
    batch, m, k, n, ta, tb, perm, softmax, ours, seed, monkeypatch
):
    """a @ b of drawn batch and matrix sizes, each operand maybe read transposed, an optional
    softmax over the result's rows, the result permuted and flattened: the value against numpy
    in float64, the gradient against the interpreter."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(batch + ((k, m) if ta else (m, k))).astype(np.float32)
    b = rng.standard_normal(batch + ((n, k) if tb else (k, n))).astype(np.float32)
    weights = rng.standard_normal(batch[0] * batch[1] * m * n).astype(np.float32)

    def loss(a, b, w):
        a = dq.transpose(a, (0, 1, 3, 2)) if ta else a
        b = dq.transpose(b, (0, 1, 3, 2)) if tb else b
        p = a @ b
        p = dq.softmax(p, axis=-1) if softmax else p
        return dq.sum(dq.reshape(dq.transpose(p, perm), (-1,)) * w)

    def np_loss(a, b, w):
        a = a.swapaxes(-1, -2) if ta else a
        b = b.swapaxes(-1, -2) if tb else b
        p = a @ b
        if softmax:
            e = np.exp(p - p.max(-1, keepdims=True))
            p = e / e.sum(-1, keepdims=True)
        return (p.transpose(perm).reshape(-1) * w).sum()

    with monkeypatch.context() as mp:
        if ours:
            mp.setattr(gemm_runtime, "GEMM_MIN_MACS", 1)
        value, grads = dq.jit(dq.value_and_grad(loss, argnums=(0, 1)))(a, b, weights)
    want = np_loss(*(x.astype(np.float64) for x in (a, b, weights)))
    scale = np.abs(weights).sum() * (1 if softmax else np.abs(a).max() * np.abs(b).max() * k)
    assert abs(value - want) <= 1e-5 * scale
    ref = dq.jit(dq.grad(loss, argnums=(0, 1)), target="interp")(
        *(x.astype(np.float64) for x in (a, b, weights))
    )
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4 * max(np.abs(r).max(), 1e-3))
