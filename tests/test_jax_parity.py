"""Issue 31's transforms, random keys and dropout, losses and layers against JAX itself (torch
where JAX has no such function): the same float64 inputs through JAX and through dq, values,
gradients, vmap'd and jvp'd results; and random programs (hypothesis) composing the transforms,
each composition against JAX's. The ops' values and gradients: tests/test_jax_parity_vocab.py;
the random keys' bits: tests/test_random.py and tests/test_random_ints.py. Skipped where JAX is
not installed (the test extra has it)."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.verify.numeric import GradientCheckError

jax = pytest.importorskip("jax")
jnp = jax.numpy
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


@pytest.fixture(autouse=True, scope="module")
def _jax_in_float64():
    """JAX computes in float64 for these tests only (the flag is global)."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


RNG = np.random.default_rng(31)
W = RNG.standard_normal((4, 3))


def close(got, want, rtol=1e-10):
    """Equal to `want` within rtol of its largest magnitude (float64 on both sides)."""
    want = np.asarray(want)
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(np.abs(want).max(), 1e-300))


def interp(fn):
    return dq.jit(fn, target="interp")


# one function written once for both libraries: m is dq or JAX's namespace below
class J:
    tanh, sin, exp, sum, log1p = jnp.tanh, jnp.sin, jnp.exp, jnp.sum, jnp.log1p
    sigmoid, softplus = jax.nn.sigmoid, jax.nn.softplus
    max = staticmethod(lambda x, axis=None: jnp.max(x, axis=axis))
    stop_gradient = jax.lax.stop_gradient


def loss(m, w, x):
    """A scalar of w (4, 3) and one example x (5, 4)."""
    h = m.tanh(x @ w)
    return m.sum(h * m.sin(x[:, :3])) + m.sum(m.softplus(h) ** 2) * 0.5


def vector(m, x):
    """A vector (4,) of x (3,)."""
    return m.tanh(W @ x) * m.sum(x**2) + m.sigmoid(W @ x)


# ---------------------------------------------------------------- vmap


def test_vmap_in_axes_out_axes_and_nesting_agree_with_jax():
    xs = RNG.standard_normal((6, 5, 4))
    for in_axes, args in [((None, 0), (W, xs)), ((None, 1), (W, xs.transpose(1, 0, 2)))]:
        got = dq.vmap(lambda w, x: loss(dq, w, x), in_axes=in_axes)(*args)
        close(got, jax.vmap(lambda w, x: loss(J, w, x), in_axes=in_axes)(*args))
    ws = RNG.standard_normal((2, 4, 3))  # nested: over weights outside, examples inside
    inner = (lambda m: lambda w, x: loss(m, w, x), (None, 0))
    got = dq.vmap(dq.vmap(inner[0](dq), inner[1]), (0, None))(ws, xs)
    want = jax.vmap(jax.vmap(inner[0](J), inner[1]), (0, None))(ws, xs)
    close(got, want)
    x3 = RNG.standard_normal((3, 7))  # out_axes: the batch on the last axis of a vector result
    got = interp(dq.vmap(lambda x: vector(dq, x), in_axes=1, out_axes=1))(x3)
    close(got, jax.vmap(lambda x: vector(J, x), in_axes=1, out_axes=1)(x3))


def test_vmap_of_grad_and_grad_of_vmap_agree_with_jax():
    xs = RNG.standard_normal((6, 5, 4))
    per_example = interp(dq.vmap(dq.grad(lambda w, x: loss(dq, w, x)), in_axes=(None, 0)))
    want = jax.vmap(jax.grad(lambda w, x: loss(J, w, x)), in_axes=(None, 0))(W, xs)
    close(per_example(W, xs), want)
    total = dq.grad(lambda w: dq.sum(dq.vmap(lambda x: loss(dq, w, x))(xs)))
    close(total(W), jax.grad(lambda w: jnp.sum(jax.vmap(lambda x: loss(J, w, x))(xs)))(W))


# ---------------------------------------------------------------- forward mode and Jacobians


def test_jvp_and_linearize_agree_with_jax():
    x, t = RNG.standard_normal(3), RNG.standard_normal(3)
    y, ty = dq.jvp(lambda x: vector(dq, x), (x,), (t,))
    jy, jty = jax.jvp(lambda x: vector(J, x), (x,), (t,))
    close(y, jy)
    close(ty, jty)
    tw, tx = RNG.standard_normal((4, 3)), RNG.standard_normal((5, 4))  # two arguments
    xm = RNG.standard_normal((5, 4))
    _, got = dq.jvp(lambda w, x: loss(dq, w, x), (W, xm), (tw, tx))
    close(got, jax.jvp(lambda w, x: loss(J, w, x), (W, xm), (tw, tx))[1])
    y, f_jvp = dq.linearize(lambda x: vector(dq, x), x)
    jy, jf_jvp = jax.linearize(lambda x: vector(J, x), x)
    close(y, jy)
    for _ in range(2):
        t = RNG.standard_normal(3)
        close(f_jvp(t), jf_jvp(t))


def test_jacobians_and_hessian_agree_with_jax():
    x = RNG.standard_normal(3)
    want = jax.jit(jax.jacfwd(lambda x: vector(J, x)))(x)
    close(dq.jacfwd(lambda x: vector(dq, x))(x), want)
    close(dq.jacrev(lambda x: vector(dq, x))(x), want)
    xm = RNG.standard_normal((5, 4))  # a matrix argument, argnums=1
    want = jax.jit(jax.jacrev(lambda w, x: jnp.tanh(x @ w), argnums=1))(W, xm)
    close(dq.jacrev(lambda w, x: dq.tanh(x @ w), argnums=1)(W, xm), want)
    close(dq.jacfwd(lambda w, x: dq.tanh(x @ w), argnums=1)(W, xm), want)
    h = dq.hessian(lambda x: dq.sum(vector(dq, x) ** 2))(x)
    close(h, jax.jit(jax.hessian(lambda x: jnp.sum(vector(J, x) ** 2)))(x), rtol=1e-9)


# ---------------------------------------------------------------- stop_gradient, has_aux


def test_stop_gradient_and_has_aux_agree_with_jax():
    x = RNG.standard_normal(4)

    def f(m, x):
        return m.sum(x * m.stop_gradient(x**2) + m.sin(x)), {"c": m.exp(x) * 2}

    (v, aux), g = dq.value_and_grad(lambda x: f(dq, x), has_aux=True)(x)
    (jv, jaux), jg = jax.value_and_grad(lambda x: f(J, x), has_aux=True)(x)
    close(v, jv)
    close(aux["c"], jaux["c"])
    close(g, jg)
    g2, aux2 = dq.grad(lambda x: f(dq, x), has_aux=True)(x)
    close(g2, jg)
    close(aux2["c"], jaux["c"])
    # second order through stop_gradient: JAX's zero, not 2x
    second = dq.grad(lambda x: dq.grad(lambda x: f(dq, x)[0])(x)[1])(x)
    close(second, jax.grad(lambda x: jax.grad(lambda x: f(J, x)[0])(x)[1])(x))


# ---------------------------------------------------------------- custom_vjp, check_grads


def scaled_softplus(m, scale):
    """softplus(x) * y whose adjoint in x is `scale` times the true one, in dq or JAX."""
    custom = dq.custom_vjp if m is dq else jax.custom_vjp

    @custom
    def f(x, y):
        return m.log1p(m.exp(x)) * y

    def fwd(x, y):
        return f(x, y), (m.sigmoid(x), m.log1p(m.exp(x)), y)

    def bwd(res, g):
        s, sp, y = res
        return (g * s * y * scale, g * sp)

    f.defvjp(fwd, bwd)
    return f


def test_custom_vjp_and_check_grads_agree_with_jax():
    from jax.test_util import check_grads as jax_check_grads

    x, y = RNG.standard_normal(3), RNG.standard_normal(3)
    f, jf = scaled_softplus(dq, 3.0), scaled_softplus(J, 3.0)
    close(dq.jit(f)(x, y), jf(x, y))
    got = dq.grad(lambda x, y: dq.sum(f(x, y)), argnums=(0, 1))(x, y)
    want = jax.grad(lambda x, y: jnp.sum(jf(x, y)), argnums=(0, 1))(x, y)
    for a, b in zip(got, want):
        close(a, b)
    # both accept the true adjoint and reject the scaled one
    dq.check_grads(scaled_softplus(dq, 1.0), (x, y), order=1, modes=("rev",))
    jax_check_grads(scaled_softplus(J, 1.0), (x, y), order=1, modes=("rev",))
    with pytest.raises(GradientCheckError):
        dq.check_grads(f, (x, y), order=1, modes=("rev",))
    with pytest.raises(AssertionError):
        jax_check_grads(jf, (x, y), order=1, modes=("rev",))


# ---------------------------------------------------------------- randomness and dropout


def test_dropout_is_flaxs_with_jaxs_bits():
    """dq.nn.dropout(key, rate, x) inside a jitted step keeps x / (1 - rate) where JAX's
    bernoulli(key, 1 - rate) draws True (flax's Dropout), on the same key."""
    x = RNG.standard_normal((8, 6)).astype(np.float32)
    for seed, rate in [(5, 0.25), (11, 0.6)]:
        key, jkey = dq.random.key(seed), jax.random.PRNGKey(seed)
        got = dq.jit(lambda k, x: dq.nn.dropout(k, rate, x), target="cpu")(key, x)
        keep = jax.random.bernoulli(jkey, jnp.float32(1 - rate), x.shape)
        want = np.where(keep, x / np.float32(1 - rate), 0).astype(np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
        k2 = dq.random.fold_in(key, 3)
        again = dq.jit(lambda k, x: dq.nn.dropout(k, rate, x), target="cpu")(k2, x)
        keep2 = jax.random.bernoulli(jax.random.fold_in(jkey, 3), jnp.float32(1 - rate), x.shape)
        np.testing.assert_array_equal(again != 0, np.asarray(keep2))


# ---------------------------------------------------------------- losses and layers


def test_mse_nll_and_eye_agree_with_jax():
    pred, target = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    close(dq.jit(dq.losses.mse)(pred, target), jnp.mean((pred - target) ** 2))
    close(
        dq.jit(lambda p, t: dq.losses.mse(p, t, reduction="none"))(pred, target),
        (pred - target) ** 2,  # optax.squared_error
    )
    g = dq.grad(lambda p: dq.losses.mse(p, target))(pred)
    close(g, jax.grad(lambda p: jnp.mean((p - target) ** 2))(pred))
    logp = np.asarray(jax.nn.log_softmax(RNG.standard_normal((6, 5))))
    labels = np.array([0, 4, 2, 2, 1, 3], np.int32)
    want = -jnp.mean(jnp.take_along_axis(logp, labels[:, None], 1))
    close(dq.jit(dq.losses.nll)(logp, labels), want)
    close(
        dq.grad(lambda p: dq.losses.nll(p, labels))(logp),
        jax.grad(lambda p: -jnp.mean(jnp.take_along_axis(p, labels[:, None], 1)))(logp),
    )
    for n, m, k in [(3, None, 0), (3, 5, 1), (4, 2, -1)]:
        np.testing.assert_array_equal(dq.eye(n, m, k), jnp.eye(n, m, k, dtype=jnp.float32))


def test_optax_named_losses_agree_with_their_jax_definitions():
    """optax's squared_error, huber_loss and l2_loss, per element (optax's formulas in JAX)."""
    pred, target = RNG.standard_normal((4, 3)) * 2, RNG.standard_normal((4, 3))
    wants = {
        "squared_error": (lambda p, t: dq.losses.squared_error(p, t), (pred - target) ** 2),
        "huber_loss": (lambda p, t: dq.losses.huber_loss(p, t, 0.7), jax_huber(pred, target, 0.7)),
        "l2_loss": (lambda p, t: dq.losses.l2_loss(p, t), 0.5 * (pred - target) ** 2),
    }
    for f, want in wants.values():
        close(dq.jit(f)(pred, target), want)
    close(dq.jit(dq.losses.squared_error)(pred), pred**2)  # targets None: 0, as optax
    g = dq.grad(lambda p: dq.sum(dq.losses.huber_loss(p, target, 0.7)))(pred)
    close(g, jax.grad(lambda p: jnp.sum(jax_huber(p, target, 0.7)))(pred))


def jax_huber(p, t, delta):
    """optax.huber_loss's formula."""
    d = jnp.abs(p - t)
    q = jnp.minimum(d, delta)
    return 0.5 * q**2 + delta * (d - q)


def test_group_norm_agrees_with_torch():
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((2, 6, 3, 4))
    w, b = RNG.standard_normal(6), RNG.standard_normal(6)
    want = torch.nn.functional.group_norm(torch.tensor(x), 3, torch.tensor(w), torch.tensor(b))
    got = dq.jit(lambda x, w, b: dq.group_norm(x, 3, w, b))(x, w, b)
    close(got, want.numpy())
    tx = torch.tensor(x, requires_grad=True)
    torch.nn.functional.group_norm(tx, 3, torch.tensor(w), torch.tensor(b)).pow(2).sum().backward()
    got = dq.grad(lambda x: dq.sum(dq.group_norm(x, 3, w, b) ** 2))(x)
    close(got, tx.grad.numpy(), rtol=1e-9)


# ---------------------------------------------------------------- random programs

UNARY = ["tanh", "sin", "sigmoid", "softplus", "square"]


def random_program(ops):
    """A scalar of (w (3,), x (4, 3)) from random unary and binary steps, a product with w and
    a row maximum, written once for dq and JAX (m)."""

    def f(m, w, x):
        h = x @ w
        for kind, i in ops:
            if kind == "u":
                name = UNARY[i % len(UNARY)]
                h = (h * h if name == "square" else getattr(m, name)(h)) * 0.5
            elif kind == "b":
                h = h * m.sum(x, axis=1) if i % 2 else h - m.sum(x, axis=1) * 0.5
            else:
                h = h + m.max(x * w, axis=1) * 0.1
        return m.sum(h)

    return f


programs = st.lists(st.tuples(st.sampled_from("ubm"), st.integers(0, 9)), min_size=1, max_size=4)


@hypothesis.settings(max_examples=10, deadline=None, derandomize=True)
@hypothesis.given(programs)
def test_random_programs_compose_the_transforms_as_jax_does(ops):
    """vmap(grad), vmap(jvp), jacfwd of a vmap and hessian, composed in one jitted program,
    against the same compositions in JAX."""
    f = random_program(ops)
    rng = np.random.default_rng(len(ops) * 10 + ops[0][1])
    w = rng.standard_normal(3) * 0.5
    xs = rng.standard_normal((3, 4, 3)) * 0.5
    v = rng.standard_normal(3)

    def composed(m, vmap, grad, jvp, jacfwd, hessian):
        def run(w, xs):
            fm = lambda w, x: f(m, w, x)
            grads = vmap(grad(fm), in_axes=(None, 0))(w, xs)
            tangents = vmap(lambda x: jvp(lambda w: fm(w, x), (w,), (v,))[1])(xs)
            jac = jacfwd(lambda w: vmap(lambda x: fm(w, x))(xs))(w)
            hess = hessian(lambda w: fm(w, xs[0]))(w)
            return grads, tangents, jac, hess

        return run

    got = interp(composed(dq, dq.vmap, dq.grad, dq.jvp, dq.jacfwd, dq.hessian))(w, xs)
    want = jax.jit(composed(J, jax.vmap, jax.grad, jax.jvp, jax.jacfwd, jax.hessian))(w, xs)
    for a, b in zip(got, want):
        close(a, b, rtol=1e-9)
