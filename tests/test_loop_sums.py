"""The loop rule of ir/loop_sums.py: a scan carry that only adds a per-step product leaves the
loop as one product over all steps. It fires on the weight gradient of an RNN's adjoint and on
a hand-written accumulator; it does not fire on a carry the body reads, a decayed sum, an
invariant factor, or where storing the factors costs more than updating the sum. Every
rewritten program is run against the program as written on the reference interpreter."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_loop_rules import rewritten, traced

import dlvm_eq as dq
from dlvm_eq.ir import interpret, verify
from dlvm_eq.ir.control_flow import reachable_bodies

RNG = np.random.default_rng(31)


def _carries(fn) -> list[int]:
    return [i.attrs["carries"] for i in fn.body if i.op == "scan"]


def _same(m0, m1, name, args):
    """The rewritten program equals the program as written on the interpreter (float32, as
    declared: the sum regrouped rounds differently, within a tolerance relative to the largest
    element, so that an element that cancels does not decide)."""
    got, want = interpret(m1, name, *args), interpret(m0, name, *args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        w = np.asarray(w)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(w).max()))


def _accumulating(update):
    """A tanh RNN whose scan also carries a sum; `update(acc, h, x, w)` is its next value."""

    def f(w, h0, xs):
        def step(c, x):
            h, acc = c
            h2 = dq.tanh(h @ w + x)
            return (h2, update(acc, h2, x, w)), None

        (h, acc), _ = dq.scan(step, (h0, dq.zeros_like(w)), xs)
        return h, acc

    return f


def _args(batch=2, width=16, steps=5):
    return (
        (RNG.standard_normal((width, width)) * 0.3).astype(np.float32),
        RNG.standard_normal((batch, width)).astype(np.float32),
        RNG.standard_normal((steps, batch, width)).astype(np.float32),
    )


def test_a_sum_of_per_step_products_leaves_the_loop():
    args = _args()
    m0, fn = traced(_accumulating(lambda acc, h, x, w: acc + dq.transpose(x) @ h), *args)
    m1, new = rewritten(fn)
    assert _carries(fn) == [2] and _carries(new) == [1]  # the sum is no carry any more
    dots = [i for i in new.body if i.op == "dot"]
    assert len(dots) == 1 and dots[0].operands[1].type.shape == (5 * 2, 16)  # over all steps
    _same(m0, m1, fn.name, args)


def test_a_sum_of_products_of_two_body_values_leaves_the_loop():
    args = _args()
    m0, fn = traced(_accumulating(lambda acc, h, x, w: acc + dq.transpose(h) @ dq.tanh(x)), *args)
    m1, new = rewritten(fn)
    assert _carries(new) == [1]
    _same(m0, m1, fn.name, args)


def test_a_sum_the_body_reads_stays():
    def update(acc, h, x, w):
        return acc + dq.transpose(x) @ (h + dq.sum(acc))

    args = _args()
    m0, fn = traced(_accumulating(update), *args)
    m1, new = rewritten(fn)
    assert _carries(new) == [2]
    _same(m0, m1, fn.name, args)


def test_a_decayed_sum_stays():
    args = _args()
    m0, fn = traced(_accumulating(lambda acc, h, x, w: acc * 0.5 + dq.transpose(x) @ h), *args)
    m1, new = rewritten(fn)
    assert _carries(new) == [2]
    _same(m0, m1, fn.name, args)


def test_a_product_with_an_invariant_factor_stays():
    args = _args()
    # sum_t W (h_t^T h_t) is W sum_t h_t^T h_t: another rule's, not this one's
    m0, fn = traced(_accumulating(lambda acc, h, x, w: acc + w @ (dq.transpose(h) @ h)), *args)
    m1, new = rewritten(fn)
    assert _carries(new) == [2]
    _same(m0, m1, fn.name, args)


def test_a_sum_smaller_than_what_it_would_store_stays():
    # a 2 x 2 sum of (2 x 8) @ (8 x 2) products: storing each step's 8 x 2 factor costs more
    args = _args(batch=8, width=2)
    m0, fn = traced(_accumulating(lambda acc, h, x, w: acc + dq.transpose(x) @ h), *args)
    _, new = rewritten(fn)
    assert _carries(new) == [2]


def test_the_weight_gradient_of_an_rnn_is_one_product_after_the_loop():
    w = (RNG.standard_normal((16, 16)) * 0.3).astype(np.float32)
    h0 = RNG.standard_normal((2, 16)).astype(np.float32)
    xs = RNG.standard_normal((6, 2, 16)).astype(np.float32)

    def loss(w, h0, xs):
        _, ys = dq.scan(lambda h, x: (lambda h: (h, h))(dq.tanh(h @ w + x)), h0, xs)
        return dq.sum(ys * ys)

    m0, fn = traced(dq.grad(loss), w, h0, xs)
    m1, new = rewritten(fn)
    adjoint = [i for i in new.body if i.op == "scan"][-1]
    assert not any(
        i.op == "dot" and i.result.type.shape == (16, 16) for i in adjoint.attrs["body"].body
    )
    _same(m0, m1, fn.name, (w, h0, xs))
    got = dq.jit(dq.grad(loss))(w, h0, xs)  # compiled: the rule on the native loop driver
    want = interpret(m0, fn.name, w, h0, xs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.integers(2, 5),
    batch=st.integers(1, 3),
    width=st.sampled_from([8, 12]),
    reverse=st.booleans(),
    form=st.sampled_from(["xT h", "hT tanh x", "slice"]),
    seed=st.integers(0, 2**16),
)
def test_random_accumulating_scans_equal_the_program_as_written(
    steps, batch, width, reverse, form, seed
):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((width, width)) * 0.3).astype(np.float32)
    h0 = rng.standard_normal((batch, width)).astype(np.float32)
    xs = rng.standard_normal((steps, batch, width)).astype(np.float32)
    half = width // 2

    def term(h, x):
        if form == "xT h":
            return dq.transpose(x) @ h
        if form == "hT tanh x":
            return dq.transpose(h) @ dq.tanh(x)
        return (dq.transpose(x) @ h)[:, :half]

    def f(w, h0, xs):
        def step(c, x):
            h, acc, n = c
            h2 = dq.tanh(h @ w + x)
            return (h2, acc + term(h2, x), n + 1.0), h2

        zero = dq.zeros((width, half if form == "slice" else width), dtype=np.float32)
        (h, acc, n), ys = dq.scan(step, (h0, zero, 0.0), xs, reverse=reverse)
        return acc, h, ys * n

    m0, fn = traced(f, w, h0, xs)
    m1, new = rewritten(fn)
    assert _carries(new) == [2]  # the sum left; the hidden state and the count stay
    for body in reachable_bodies(new):
        verify(m1)
        assert body.name in m1.functions
    _same(m0, m1, fn.name, (w, h0, xs))
