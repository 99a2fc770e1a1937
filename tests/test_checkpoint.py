"""dq.checkpoint (jax.checkpoint): the gradient through a checkpointed function equals the
gradient without it (interp and cpu), and JAX's; inside a scan body it cuts what the forward
scan stacks for the backward scan to the carries (bytes read off the gradient's IR)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.ir.control_flow import SCAN

RNG = np.random.default_rng(5)
W = RNG.standard_normal((4, 4)) * 0.4
H0 = RNG.standard_normal((2, 4))
XS = RNG.standard_normal((6, 2, 4))


def _step(w):
    return lambda h, x: dq.tanh(dq.sin(dq.tanh(h @ w + x) @ w) * h)


def rnn_loss(remat: bool):
    def loss(w, h0, xs):
        f = _step(w)
        if remat:
            f = dq.checkpoint(f)
        h, ys = dq.scan(lambda h, x: (f(h, x), h * 2.0), h0, xs)
        return dq.sum(h * h) + dq.sum(ys)

    return loss


def stored_bytes(module) -> int:
    """Bytes the forward scans stack for the backward scans: the `over` operands of each
    reverse-direction adjoint scan that a forward scan produced."""
    fn = next(iter(module.functions.values()))
    made_by_scan = set()
    scans = {id(i.result) for i in fn.body if i.op == SCAN}
    for i in fn.body:
        if i.op == "extract" and id(i.operands[0]) in scans:
            made_by_scan.add(id(i.result))
    total = 0
    for i in fn.body:
        if i.op != SCAN or not i.attrs["body"].name.endswith(".adjoint"):
            continue
        nc, nx = i.attrs["carries"], i.attrs["xs"]
        for o in i.operands[nc : nc + nx]:
            if id(o) in made_by_scan:
                total += int(np.prod(o.type.shape)) * o.type.dtype.numpy.itemsize
    return total


@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_checkpointed_scan_body_has_the_same_gradient(target):
    args = (W, H0, XS)
    plain = dq.jit(dq.grad(rnn_loss(False), argnums=(0, 1, 2)), target=target)(*args)
    remat = dq.jit(dq.grad(rnn_loss(True), argnums=(0, 1, 2)), target=target)(*args)
    for a, b in zip(remat, plain):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_checkpoint_stores_only_the_carries_of_a_scan():
    args = (W, H0, XS)
    plain = stored_bytes(dq.make_ir(dq.grad(rnn_loss(False)))(*args))
    remat = stored_bytes(dq.make_ir(dq.grad(rnn_loss(True)))(*args))
    carry_stack = XS.shape[0] * H0.nbytes
    assert remat == carry_stack  # the state each step starts from, nothing else
    assert plain > 2 * carry_stack  # tanh, sin and product residuals


def test_checkpoint_at_top_level_and_as_decorator():
    x = RNG.standard_normal((3, 4))

    @dq.checkpoint
    def block(w, x):
        return dq.tanh(dq.tanh(x @ w) @ w), dq.exp(x * 0.1)

    def loss(w, x, remat=True):
        a, b = block(w, x) if remat else block.__wrapped__(w, x)
        return dq.sum(a * a) + dq.sum(b)

    want = dq.grad(lambda w, x: loss(w, x, False), argnums=(0, 1))(W, x)
    for target in ("interp", "cpu"):
        got = dq.jit(dq.grad(loss, argnums=(0, 1)), target=target)(W, x)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    # eager, outside a trace, it is the function itself
    np.testing.assert_allclose(block(W, x)[0], block.__wrapped__(W, x)[0])


def test_checkpoint_rejects_a_policy():
    with pytest.raises(TypeError, match="policy"):
        dq.checkpoint(lambda x: x, policy=object())


def test_checkpoint_gradient_equals_jax():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:

        def jloss(w, h0, xs):
            f = jax.checkpoint(lambda h, x: jnp.tanh(jnp.sin(jnp.tanh(h @ w + x) @ w) * h))
            h, ys = jax.lax.scan(lambda h, x: (f(h, x), h * 2.0), h0, xs)
            return jnp.sum(h * h) + jnp.sum(ys)

        want = jax.grad(jloss, argnums=(0, 1, 2))(W, H0, XS)
    finally:
        jax.config.update("jax_enable_x64", previous)
    got = dq.jit(dq.grad(rnn_loss(True), argnums=(0, 1, 2)))(W, H0, XS)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-9, atol=1e-12)


UNARY = [dq.tanh, dq.sin, dq.sigmoid, lambda v: v * 0.5]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)), min_size=1, max_size=5),
    st.sampled_from([0, 1, 4]),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_random_checkpointed_bodies_keep_the_gradient(ops, length, reverse, seed):
    def body(w, h, x):
        vals = [h, x, w]
        for k, a in ops:
            u = vals[a % len(vals)]
            vals.append(UNARY[k](u) * vals[(a + k) % len(vals)])
        return dq.tanh(vals[-1])

    def loss(w, h0, xs, remat):
        f = dq.checkpoint(body) if remat else body
        h, ys = dq.scan(lambda h, x: (f(w, h, x), h), h0, xs, reverse=reverse)
        return dq.sum(h * h) + dq.sum(ys * 0.5)

    rng = np.random.default_rng(seed)
    args = (rng.standard_normal(3), rng.standard_normal(3), rng.standard_normal((length, 3)))
    want = dq.grad(lambda *a: loss(*a, False), argnums=(0, 1, 2))(*args)
    got = dq.jit(dq.grad(lambda *a: loss(*a, True), argnums=(0, 1, 2)), target="cpu")(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-11)


def test_checkpoint_of_a_pytree_function_with_a_python_argument():
    def block(p, x, scale):
        return {"a": dq.tanh(x @ p["w"]) * scale, "b": dq.sin(x) + p["c"]}

    def loss(p, x, remat):
        f = dq.checkpoint(block, static_argnums=(2,)) if remat else block
        out = f(p, x, 3.0)
        return dq.sum(out["a"] * out["b"])

    p = {"w": W, "c": RNG.standard_normal(4)}
    x = RNG.standard_normal((2, 4))
    want = dq.grad(lambda p, x: loss(p, x, False), argnums=(0, 1))(p, x)
    got = dq.jit(dq.grad(lambda p, x: loss(p, x, True), argnums=(0, 1)))(p, x)
    np.testing.assert_allclose(got[0]["w"], want[0]["w"], rtol=1e-10)
    np.testing.assert_allclose(got[0]["c"], want[0]["c"], rtol=1e-10)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-10)


def test_per_example_gradients_through_a_checkpointed_scan_body():
    xs = RNG.standard_normal((3, 5, 4))

    def loss(w, h0, xs):
        f = dq.checkpoint(lambda h, x: dq.tanh(h @ w + x))
        h, _ = dq.scan(lambda h, x: (f(h, x), None), h0, xs)
        return dq.sum(h * h)

    got = dq.jit(dq.vmap(dq.grad(loss), in_axes=(None, None, 0)))(W, H0[0], xs)
    for b in range(3):
        np.testing.assert_allclose(got[b], dq.grad(loss)(W, H0[0], xs[b]), rtol=1e-10)
