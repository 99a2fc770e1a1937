"""Random programs of transposes, maps, selects, batched products, reductions and convolutions
(hypothesis), and attention heads split and merged several ways, agree after the layout rules
(rules/layout.egg) with two oracles: the value with numpy in float64, the gradient with the
reference interpreter (`target="interp"`, the unoptimized program)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    max_examples=12,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PERMS = list(itertools.permutations(range(3)))
MAPS = ("tanh", "sin", "relu", "cos")  # bounded: repeated maps must not overflow


def _np_map(name, h):
    return np.maximum(h, 0.0) if name == "relu" else getattr(np, name)(h)


def _dq_map(name, h):
    return getattr(dq, name)(h)


def _run(steps, F, x, mapf):
    """The program `steps` over x with the array functions F (numpy or dlvm_eq)."""
    h = x
    for op, arg in steps:
        if op == "T":
            h = F.transpose(h, arg)
        elif op == "map":
            h = mapf(arg, h)
        elif op == "add":  # x read in h's layout: a transpose that can cancel with h's
            h = h + F.transpose(x, tuple(x.shape.index(d) for d in h.shape))
        elif op == "select":  # the ReLU adjoint's shape: where(h > 0, h, 0)
            h = F.where(h > 0.0, h, 0.0 * h)
        elif op == "bmm":  # h @ h^T over the last two axes, then back to a rank-3 of x's dims
            h = F.sum(h @ F.transpose(h, (0, 2, 1)), axis=arg) * 0.1
            return F.sum(h * h)
        elif op == "sum":
            return F.sum(F.sum(h, axis=arg) ** 2)
    return F.sum(h * h)


STEP = st.one_of(
    st.tuples(st.just("T"), st.sampled_from(PERMS)),
    st.tuples(st.just("map"), st.sampled_from(MAPS)),
    st.tuples(st.just("add"), st.none()),
    st.tuples(st.just("select"), st.none()),
)
END = st.one_of(
    st.tuples(st.just("sum"), st.integers(0, 2)),
    st.tuples(st.just("bmm"), st.integers(0, 2)),
    st.tuples(st.just("end"), st.none()),
)


def _check(loss_np, loss_dq, x):
    want = loss_np(x.astype(np.float64))
    got = dq.jit(loss_dq)(x)
    np.testing.assert_allclose(float(got), want, rtol=2e-4)
    g = dq.jit(dq.grad(loss_dq))(x)
    g_ref = dq.jit(dq.grad(loss_dq), target="interp")(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=2e-3, atol=1e-4)


@settings(**SETTINGS)
@given(st.lists(STEP, min_size=1, max_size=6), END, st.integers(0, 2**16))
def test_random_layout_programs_agree(steps, end, seed):
    steps = steps + [end]
    x = (np.random.default_rng(seed).standard_normal((2, 3, 4)) * 0.5).astype(np.float32)
    _check(
        lambda a: _run(steps, np, a, _np_map),
        lambda a: _run(steps, dq, a, _dq_map),
        x,
    )


def _conv_program(steps, F, x, w, mapf, conv):
    h = conv(x, w)  # NCHW (2, 4, 4, 4)
    for op, arg in steps:
        if op == "nhwc":  # to NHWC, a map there, and back: the pair cancels after the map moves
            h = F.transpose(mapf(arg, F.transpose(h, (0, 2, 3, 1))), (0, 3, 1, 2))
        elif op == "map":
            h = mapf(arg, h)
        elif op == "chansum":  # a per-channel sum read through NHWC
            return F.sum(F.sum(F.sum(F.transpose(h, (0, 2, 3, 1)), axis=0), axis=0) ** 2)
    return F.sum(h * h)


def _np_conv(x, w):
    import torch

    return torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w)).numpy()


@settings(**SETTINGS)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("nhwc"), st.sampled_from(MAPS)),
            st.tuples(st.just("map"), st.sampled_from(MAPS)),
        ),
        min_size=1,
        max_size=4,
    ),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_random_conv_layout_programs_agree(steps, chansum, seed):
    pytest.importorskip("torch")
    steps = steps + ([("chansum", None)] if chansum else [])
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((2, 3, 6, 6)) * 0.5).astype(np.float32)
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    want = _conv_program(steps, np, x.astype(np.float64), w.astype(np.float64), _np_map, _np_conv)

    def loss(a, b):
        return _conv_program(steps, dq, a, b, _dq_map, dq.conv2d)

    np.testing.assert_allclose(float(dq.jit(loss)(x, w)), want, rtol=2e-4)
    g = dq.jit(dq.grad(loss, argnums=(0, 1)))(x, w)
    g_ref = dq.jit(dq.grad(loss, argnums=(0, 1)), target="interp")(x, w)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-3, atol=1e-4)


def _attention_program(x, F, k_route, merge, tanh_out):
    """Heads split from x (B, T, H*d) three ways (q, k, v), softmax(q kᵀ) v, heads merged:
    k_route says how kᵀ is written (one permutation, or two transposes in a row, or the
    product's transpose), merge how the heads come back (transpose + reshape, or a sum)."""
    B, T, H, d = 2, 6, 2, 4
    heads = [
        F.transpose(F.reshape(x[..., i * H * d : (i + 1) * H * d], (B, T, H, d)), (0, 2, 1, 3))
        for i in range(3)
    ]
    q, k, v = heads
    if k_route == "one":
        s = q @ F.transpose(F.reshape(x[..., H * d : 2 * H * d], (B, T, H, d)), (0, 2, 3, 1))
    elif k_route == "two":
        s = q @ F.transpose(k, (0, 1, 3, 2))
    else:  # (k qᵀ)ᵀ
        s = F.transpose(k @ F.transpose(q, (0, 1, 3, 2)), (0, 1, 3, 2))
    s = s * 0.5
    e = F.exp(s - F.max(s, axis=-1, keepdims=True))
    p = e / F.sum(e, axis=-1, keepdims=True)
    o = p @ v  # (B, H, T, d)
    if merge == "reshape":
        o = F.reshape(F.transpose(o, (0, 2, 1, 3)), (B, T, H * d))
    else:
        o = F.sum(o, axis=1)
    return F.sum(F.tanh(o) * o) if tanh_out else F.sum(o * o)


@settings(**SETTINGS)
@given(
    st.sampled_from(("one", "two", "product")),
    st.sampled_from(("reshape", "sum")),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_random_attention_layouts_agree(k_route, merge, tanh_out, seed):
    x = np.random.default_rng(seed).standard_normal((2, 6, 24)).astype(np.float32)

    def loss(a):
        return _attention_program(a, dq, k_route, merge, tanh_out)

    _check(lambda a: _attention_program(a, np, k_route, merge, tanh_out), loss, x)
