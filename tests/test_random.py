"""dq.random (issue 31): threefry2x32 on i32 words (the IR's xor, shiftLeft, shiftRightLogical
and wrapping add), the same bits on interp, cpu (any thread count) and the emulated gpu;
Random123's known answers; JAX's keys, split, fold_in, bits, uniform, bernoulli bit for bit
and normal to an f32 ulp; dropout inside a jitted training step."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq import config

R = dq.random


def words(values) -> np.ndarray:
    return np.array(values, np.uint32).view(np.int32)


# Random123's threefry2x32_20 known answers: (key, counter) -> output
KNOWN = [
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


def _threefry(key, ctr):
    y0, y1 = R.threefry2x32(key, ctr[:, 0], ctr[:, 1])
    return dq.stack([y0, y1], axis=1)


@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_threefry_known_answers(target):
    f = dq.jit(_threefry, target=target)
    for key, ctr, want in KNOWN:
        np.testing.assert_array_equal(f(words(key), words([ctr]))[0], words(want))
        np.testing.assert_array_equal(_threefry(words(key), words([ctr]))[0], words(want))


def test_same_bits_on_every_target_and_thread_count(monkeypatch):
    import fake_cupy

    key = R.key(2024)
    want = R.bits(key, (1000, 1001))  # eagerly, numpy
    for threads in ("1", "3"):
        monkeypatch.setenv("DLVM_EQ_NUM_THREADS", threads)
        config.reload()
        got = dq.jit(lambda k: R.bits(k, (1000, 1001)), target="cpu")(key)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        dq.jit(lambda k: R.bits(k, (1000, 1001)), target="interp")(key), want
    )
    with fake_cupy.installed(monkeypatch, sms=1) as cp:
        got = dq.jit(lambda k: R.bits(k, (3, 37)), target="gpu")(cp.asarray(key)).get()
    np.testing.assert_array_equal(
        got, want.reshape(-1)[: 3 * 37].reshape(3, 37) * 0 + R.bits(key, (3, 37))
    )


def test_keys_and_draws_are_jaxs():
    jax = pytest.importorskip("jax")
    if not jax.config.jax_threefry_partitionable:
        pytest.skip("this JAX draws with the original (non-partitionable) threefry layout")
    k, jk = R.key(42), jax.random.PRNGKey(42)
    np.testing.assert_array_equal(k.view(np.uint32), np.asarray(jk))
    np.testing.assert_array_equal(R.key(-3).view(np.uint32), np.asarray(jax.random.PRNGKey(-3)))
    step = dq.jit(
        lambda k: (
            (R.split(k, 3), R.fold_in(k, 7), R.bits(k, (3, 5)), R.uniform(k, (4, 6)))
            + (R.bernoulli(k, 0.3, (50,)), R.normal(k, (2000,)))
        ),
        target="cpu",
    )
    split, folded, bits, uniform, coin, normal = step(k)
    np.testing.assert_array_equal(split.view(np.uint32), np.asarray(jax.random.split(jk, 3)))
    np.testing.assert_array_equal(folded.view(np.uint32), np.asarray(jax.random.fold_in(jk, 7)))
    np.testing.assert_array_equal(bits.view(np.uint32), np.asarray(jax.random.bits(jk, (3, 5))))
    np.testing.assert_array_equal(uniform, np.asarray(jax.random.uniform(jk, (4, 6))))
    np.testing.assert_array_equal(coin, np.asarray(jax.random.bernoulli(jk, 0.3, (50,))))
    np.testing.assert_allclose(normal, np.asarray(jax.random.normal(jk, (2000,))), atol=1e-6)


def test_uniform_and_normal_look_like_their_distributions():
    u = dq.jit(lambda k: R.uniform(k, (200_000,), minval=-2.0, maxval=3.0))(R.key(5))
    assert u.min() >= -2.0 and u.max() < 3.0 and abs(u.mean() - 0.5) < 0.02
    z = dq.jit(lambda k: R.normal(k, (200_000,)))(R.key(6))
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01 and np.isfinite(z).all()
    a, b = R.split(R.key(0))
    assert not np.array_equal(R.bits(a, 8), R.bits(b, 8))


@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_dropout_in_a_jitted_training_step(target):
    rng = np.random.default_rng(0)
    w, x = (
        rng.standard_normal((6, 4)).astype(np.float32),
        rng.standard_normal((8, 6)).astype(np.float32),
    )

    def loss(w, x, key):
        h = dq.nn.dropout(key, 0.25, x @ w)
        return dq.sum(h * h)

    step = dq.jit(dq.value_and_grad(loss), target=target)
    key = R.key(1)
    value, grad = step(w, x, key)
    keep = R.bernoulli(key, 0.75, (8, 4))
    h = np.where(keep, (x @ w) / 0.75, 0)
    np.testing.assert_allclose(value, np.sum(h * h), rtol=1e-5)
    np.testing.assert_allclose(grad, x.T @ (2 * h / 0.75 * keep), rtol=1e-4, atol=1e-5)
    assert 0.6 < keep.mean() < 0.9
    other, _ = step(w, x, R.fold_in(key, 1))
    assert other != value  # another key, another mask
    np.testing.assert_array_equal(dq.nn.dropout(key, 0.0, x), x)
