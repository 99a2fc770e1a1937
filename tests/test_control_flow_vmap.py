"""dq.vmap over functions with scan, while_loop, cond and switch (ir/registry/control_batch.py):
equal to a Python loop over the examples (each example run alone) and to jax.vmap, on the
interpreter and the cpu compile; per-example gradients through a scan; random loop bodies
(hypothesis)."""

from __future__ import annotations

import operator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq

RNG = np.random.default_rng(3)
W = RNG.standard_normal((4, 4)) * 0.4
H0 = RNG.standard_normal(4)
XS = RNG.standard_normal((3, 5, 4))  # 3 examples of 5 steps
X = RNG.standard_normal((3, 4))


def rnn(w, h0, xs):
    h, ys = dq.scan(lambda h, x: (dq.tanh(h @ w + x), h * 2.0), h0, xs)
    return h, ys


def per_example(f, in_axes, *args):
    """f run on each example alone, the results stacked."""
    size = next(a.shape[ax] for a, ax in zip(args, in_axes) if ax is not None)
    outs = []
    for b in range(size):
        one = [a if ax is None else np.take(a, b, axis=ax) for a, ax in zip(args, in_axes)]
        out = f(*one)
        outs.append(out if isinstance(out, tuple) else (out,))
    stacked = tuple(np.stack([np.asarray(o[k]) for o in outs]) for k in range(len(outs[0])))
    return stacked if len(stacked) > 1 else stacked[0]


def assert_close(got, want, tol=1e-10):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def while_fn(n, x):
    return dq.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, dq.sin(c[1]) + 1.0), (0, x))


def cond_fn(p, x):
    return dq.cond(p > 0.0, lambda x: dq.sin(x) * p, lambda x: x * 2.0, x)


def switch_fn(k, x):
    return dq.switch(k, [lambda x: x + 1.0, lambda x: x * 3.0, dq.exp], x)


CASES = {
    "scan, batched xs": (rnn, (None, None, 0), (W, H0, XS)),
    "scan, batched carry and weights": (
        rnn,
        (0, 0, None),
        (np.stack([W, 2 * W, -W]), np.stack([H0, -H0, H0]), XS[0]),
    ),
    "scan, xs batched on axis 1": (rnn, (None, None, 1), (W, H0, XS.transpose(1, 0, 2))),
    "while, batched bound": (while_fn, (0, 0), (np.array([0, 2, 5], np.int32), X)),
    "while, unbatched bound": (while_fn, (None, 0), (np.int32(3), X)),
    "cond, batched predicate": (cond_fn, (0, 0), (np.array([1.0, -1.0, 2.0]), X)),
    "cond, unbatched predicate": (cond_fn, (None, 0), (np.float64(-0.5), X)),
    "switch, batched index": (switch_fn, (0, 0), (np.array([-1, 1, 7], np.int32), X)),
    "switch, unbatched index": (switch_fn, (None, 0), (np.int32(2), X)),
}


@pytest.mark.parametrize("target", ["interp", "cpu"])
@pytest.mark.parametrize("case", list(CASES))
def test_vmap_of_control_flow_equals_a_loop_over_examples(case, target):
    f, in_axes, args = CASES[case]
    got = dq.jit(dq.vmap(f, in_axes=in_axes), target=target)(*args)
    assert_close(got, per_example(f, in_axes, *args))


def test_vmap_of_a_scan_equals_jax():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:

        def jrnn(w, h0, xs):
            return jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x), h * 2.0), h0, xs)

        def jwhile(n, x):
            body = lambda c: (c[0] + 1, jnp.sin(c[1]) + 1.0)
            return jax.lax.while_loop(lambda c: c[0] < n, body, (0, x))

        want_scan = jax.vmap(jrnn, in_axes=(None, None, 0))(W, H0, XS)
        ns = np.array([0, 2, 5], np.int32)
        want_while = jax.vmap(jwhile)(ns, X)
    finally:
        jax.config.update("jax_enable_x64", previous)
    assert_close(dq.jit(dq.vmap(rnn, in_axes=(None, None, 0)))(W, H0, XS), want_scan)
    got = dq.jit(dq.vmap(while_fn))(ns, X)
    np.testing.assert_array_equal(got[0], np.asarray(want_while[0]))
    np.testing.assert_allclose(got[1], np.asarray(want_while[1]), rtol=1e-12)


def test_per_example_gradients_through_a_scan():
    def loss(w, h0, xs):
        h, ys = rnn(w, h0, xs)
        return dq.sum(h * h) + dq.sum(ys)

    grad = dq.grad(loss, argnums=(0, 2))
    got = dq.jit(dq.vmap(grad, in_axes=(None, None, 0)))(W, H0, XS)
    want = per_example(grad, (None, None, 0), W, H0, XS)
    assert_close(got, want, 1e-9)


UNARY = [dq.tanh, dq.sin, dq.sigmoid, lambda v: v * 0.5]
BINARY = [operator.add, operator.mul, operator.sub]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 3), st.integers(0, 9), st.integers(0, 9)),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from([0, 1, 4]),
    st.booleans(),
    st.sampled_from(["none", "cond", "scan"]),
    st.tuples(st.sampled_from([None, 0]), st.sampled_from([None, 0]), st.sampled_from([None, 0])),
    st.integers(0, 2**16),
)
def test_vmap_of_random_loops_equals_a_loop_over_examples(ops, length, reverse, nested, axes, seed):
    if axes == (None, None, None):
        axes = (None, None, 0)

    def f(w, h0, xs):
        def body(h, x):
            vals = [h, x, w]
            for kind, k, a, b in ops:
                u, v = vals[a % len(vals)], vals[b % len(vals)]
                vals.append(UNARY[k](u) if kind == 0 else BINARY[k % 3](u, v))
            y = vals[-1]
            if nested == "cond":
                y = dq.cond(dq.sum(h) > 0.0, lambda y: dq.tanh(y), lambda y: y * w, y)
            elif nested == "scan":
                y = dq.scan(lambda d, _: (dq.sin(d) * w, None), y, None, length=2)[0]
            return dq.tanh(y), y * 0.5

        return dq.scan(body, h0, xs, reverse=reverse)

    rng = np.random.default_rng(seed)
    shapes = [(3,), (3,), (length, 3)]
    args = [rng.standard_normal(((2,) if ax == 0 else ()) + s) for s, ax in zip(shapes, axes)]
    got = dq.jit(dq.vmap(f, in_axes=axes), target="cpu")(*args)
    assert_close(got, per_example(f, axes, *args), 1e-9)


def test_batch_function_of_a_dl_scan_returned_whole():
    from dlvm_eq.ir import interpret, verify
    from dlvm_eq.ir.batching import batch_function
    from dlvm_eq.ir.control_flow import module_with_bodies
    from dlvm_eq.ir.module import Module
    from dlvm_eq.ir.parser import load

    m = load(Path(__file__).parent / "data" / "control_flow" / "loops.dl")
    fn = m["main"]  # returns the scan's (final carry, stacked ys) tuple as it is
    batched, flags = batch_function(fn, [True, False, False], 3, m)
    out = Module("b")
    module_with_bodies(out, batched)
    verify(out)
    h = RNG.standard_normal((3, 4)).astype(np.float32)
    xs = RNG.standard_normal((8, 3)).astype(np.float32)
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    got = interpret(out, batched.name, h, xs, w)
    assert flags == [True, True]
    for b in range(3):
        for g, want in zip(got, interpret(m, "main", h[b], xs, w)):
            np.testing.assert_allclose(g[b], want, rtol=1e-5, atol=1e-6)
