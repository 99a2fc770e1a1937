"""The vocabulary of issue 31 against JAX itself (and torch where JAX has no such function):
the same float64 inputs through JAX and through dq.jit on cpu, values and gradients (the
gradient of sum(f(x) * w)), and each op under vmap and jvp. Skipped where JAX is not
installed (the test extra has it)."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq

jax = pytest.importorskip("jax")
jnp = jax.numpy


@pytest.fixture(autouse=True, scope="module")
def _jax_in_float64():
    """JAX computes in float64 for these tests only: the flag is global, and set at import it
    would change other modules' JAX results (the high word of a negative PRNGKey seed)."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


RNG = np.random.default_rng(17)
X = RNG.standard_normal((3, 4, 5))
X[0, 0, :3] = (0.0, 6.0, -1.0)  # kinks: JAX's derivative conventions there
MAT = RNG.standard_normal((5, 6))

# name -> (dq function, JAX function, input)
CASES = {
    "silu": (dq.nn.silu, jax.nn.silu, X),
    "leaky_relu": (lambda x: dq.nn.leaky_relu(x, 0.2), lambda x: jax.nn.leaky_relu(x, 0.2), X),
    "elu": (lambda x: dq.nn.elu(x, 0.7), lambda x: jax.nn.elu(x, 0.7), X),
    "log_sigmoid": (dq.nn.log_sigmoid, jax.nn.log_sigmoid, X * 30),
    "softplus": (dq.nn.softplus, jax.nn.softplus, X * 30),
    "relu6": (dq.nn.relu6, jax.nn.relu6, X),
    "hard_tanh": (dq.nn.hard_tanh, jax.nn.hard_tanh, X),
    "celu": (lambda x: dq.nn.celu(x, 0.6), lambda x: jax.nn.celu(x, 0.6), X),
    "selu": (dq.nn.selu, jax.nn.selu, X),
    "softsign": (dq.nn.softsign, jax.nn.soft_sign, X),
    "soft_sign": (dq.nn.soft_sign, jax.nn.soft_sign, X),  # JAX's spelling
    "mish": (dq.nn.mish, jax.nn.mish, X),
    "glu": (lambda x: dq.nn.glu(x, axis=1), lambda x: jax.nn.glu(x, axis=1), X),
    "standardize": (dq.nn.standardize, jax.nn.standardize, X),
    "squeeze": (lambda x: dq.squeeze(x[:, :1], 1), lambda x: jnp.squeeze(x[:, :1], 1), X),
    "expand_dims": (lambda x: dq.expand_dims(x, (0, 2)), lambda x: jnp.expand_dims(x, (0, 2)), X),
    "broadcast_to": (
        lambda x: dq.broadcast_to(x[:, :1], (2, 3, 7, 5)),
        lambda x: jnp.broadcast_to(x[:, :1], (2, 3, 7, 5)),
        X,
    ),
    "tile": (lambda x: dq.tile(x, (2, 1, 1, 2)), lambda x: jnp.tile(x, (2, 1, 1, 2)), X),
    "repeat": (lambda x: dq.repeat(x, 3, axis=-1), lambda x: jnp.repeat(x, 3, axis=-1), X),
    "flip": (lambda x: dq.flip(x, (0, 2)), lambda x: jnp.flip(x, (0, 2)), X),
    "negative_steps": (lambda x: x[::-1, 3:0:-2], lambda x: x[::-1, 3:0:-2], X),
    "triu": (lambda x: dq.triu(x, -1), lambda x: jnp.triu(x, -1), X),
    "tril": (lambda x: dq.tril(x, 2), lambda x: jnp.tril(x, 2), X),
    "einsum_ellipsis": (
        lambda x: dq.einsum("...ij,jk->...ik", x, MAT),
        lambda x: jnp.einsum("...ij,jk->...ik", x, MAT),
        X,
    ),
    "sort": (lambda x: dq.sort(x, axis=1), lambda x: jnp.sort(x, axis=1), X),
    "sort_descending": (
        lambda x: dq.sort(x, descending=True),
        lambda x: jnp.sort(x, descending=True),
        X,
    ),
    "top_k": (lambda x: dq.top_k(x, 3)[0], lambda x: jax.lax.top_k(x, 3)[0], X),
    "take_along_axis": (
        lambda x: dq.take_along_axis(x, IDX, 1),
        lambda x: jnp.take_along_axis(x, IDX, 1),
        X,
    ),
    "upsample_nearest": (
        lambda x: dq.upsample(x, 2),
        lambda x: jax.image.resize(x, x.shape[:2] + (2 * x.shape[2], 2 * x.shape[3]), "nearest"),
        X[None],
    ),
    "upsample_bilinear": (
        lambda x: dq.upsample(x, (2, 3), mode="bilinear"),
        lambda x: jax.image.resize(x, x.shape[:2] + (2 * x.shape[2], 3 * x.shape[3]), "linear"),
        X[None],
    ),
}
IDX = RNG.integers(-4, 4, size=(3, 2, 5))


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_agree_with_jax(name):
    f, reference, x = CASES[name]
    want = np.asarray(reference(jnp.asarray(x)))
    got = dq.jit(f, target="cpu")(x)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
    w = RNG.standard_normal(want.shape)
    want_grad = np.asarray(jax.grad(lambda x: jnp.sum(reference(x) * w))(jnp.asarray(x)))
    got_grad = dq.jit(dq.grad(lambda x: dq.sum(f(x) * w)), target="cpu")(x)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", sorted(CASES))
def test_vmapped_and_jvp_results_agree_with_jax(name):
    """Each op under vmap (a batch of three inputs) and jvp (a random tangent), in one jitted
    program, against jax.vmap and jax.jvp of JAX's function."""
    f, reference, x = CASES[name]
    xs = np.stack([x, x * 1.5, -x])
    t = RNG.standard_normal(x.shape)
    both = dq.jit(lambda xs, x, t: (dq.vmap(f)(xs), dq.jvp(f, (x,), (t,))[1]), target="interp")
    got_v, got_t = both(xs, x, t)
    want_v = np.asarray(jax.vmap(reference)(jnp.asarray(xs)))
    want_t = np.asarray(jax.jvp(reference, (jnp.asarray(x),), (jnp.asarray(t),))[1])
    for got, want in ((got_v, want_v), (got_t, want_t)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


def test_indices_of_sort_and_top_k_agree_with_jax_including_ties():
    ties = RNG.integers(0, 3, size=(4, 9)).astype(np.float64)
    np.testing.assert_array_equal(dq.jit(dq.argsort)(ties), jnp.argsort(ties))
    np.testing.assert_array_equal(
        dq.jit(lambda x: dq.top_k(x, 4)[1])(ties), jax.lax.top_k(ties, 4)[1]
    )


def test_losses_agree_with_their_jax_definitions():
    pred, target = RNG.standard_normal((4, 3)) * 2, RNG.standard_normal((4, 3))
    huber = jnp.where(
        jnp.abs(pred - target) <= 1.0, 0.5 * (pred - target) ** 2, jnp.abs(pred - target) - 0.5
    )
    np.testing.assert_allclose(dq.jit(dq.losses.huber)(pred, target), jnp.mean(huber), rtol=1e-12)
    logits, labels = RNG.standard_normal((6, 5)), np.array([0, 4, 2, 2, 1, 3], np.int32)
    xent = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1)[:, 0]
    got = dq.jit(dq.losses.softmax_cross_entropy_with_integer_labels)(logits, labels)
    np.testing.assert_allclose(got, xent, rtol=1e-12)


def test_conv_transpose2d_agrees_with_torch():
    torch = pytest.importorskip("torch")
    x, w = RNG.standard_normal((2, 4, 5, 3)), RNG.standard_normal((4, 3, 3, 2))
    kw = dict(stride=(2, 1), padding=(1, 0), output_padding=(1, 0), dilation=(1, 2), groups=2)
    want = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(w), **kw).numpy()
    got = dq.jit(lambda x, w: dq.conv_transpose2d(x, w, **kw))(x, w)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_batch_norm_agrees_with_torch():
    torch = pytest.importorskip("torch")
    x, w, b = RNG.standard_normal((4, 3, 2, 5)), RNG.standard_normal(3), RNG.standard_normal(3)
    mean, var = RNG.standard_normal(3), RNG.uniform(0.5, 2, 3)
    rm, rv = torch.tensor(mean), torch.tensor(var)
    want = torch.nn.functional.batch_norm(
        torch.tensor(x), rm, rv, torch.tensor(w), torch.tensor(b), training=True, momentum=0.3
    )
    y, state = dq.jit(lambda x, s, w, b: dq.batch_norm(x, s, w, b, momentum=0.3))(
        x, dq.BatchNormState(mean, var), w, b
    )
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state.mean, rm.numpy(), rtol=1e-12)  # torch updates in place
    np.testing.assert_allclose(state.var, rv.numpy(), rtol=1e-12)
