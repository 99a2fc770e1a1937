"""dq.random.randint and dq.random.permutation (issue 31): JAX's values bit for bit, a numpy
uint32 reference of JAX's randint formula, the same bits on interp, cpu (1 and 3 threads) and
the emulated gpu, and the counts a uniform draw should give."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq import config
from dlvm_eq.errors import DlvmError

R = dq.random
BOUNDS = [(0, 10), (-5, 7), (0, 1_000_003), (0, 2**31 - 1), (-(2**31), 2**31 - 1), (3, 3), (5, -4)]


def reference_randint(key, shape, lo, hi):
    """JAX's randint in numpy uint32 arithmetic, from our split and bits (tested against JAX
    in test_random.py): the wrapping product and sum are uint32's."""
    k1, k2 = R.split(key)
    high = np.asarray(R.bits(k1, shape)).view(np.uint32)
    low = np.asarray(R.bits(k2, shape)).view(np.uint32)
    above = hi > 2**31 - 1  # JAX clips maxval to the dtype and widens the span by one
    hi = min(hi, 2**31 - 1)
    span = np.uint32(1 if hi <= lo else hi - lo + above)
    multiplier = np.uint32((2**16 % int(span)) ** 2 % 2**32 % int(span))
    with np.errstate(over="ignore"):
        offset = (high % span * multiplier + low % span) % span
    return (offset.astype(np.int64) + lo).astype(np.int32)


@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_randint_above_the_i32_range_widens_the_span(target):
    key = R.key(12)
    got = dq.jit(lambda k: R.randint(k, (64,), 7, 2**31), target=target)(key)
    np.testing.assert_array_equal(got, reference_randint(key, (64,), 7, 2**31))
    top = dq.jit(lambda k: R.randint(k, (4,), 2**31, 2**40), target=target)(key)
    np.testing.assert_array_equal(top, np.full(4, 2**31 - 1, np.int32))


@pytest.mark.parametrize("lo,hi", BOUNDS)
@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_randint_matches_the_uint32_reference(target, lo, hi):
    key = R.key(11)
    want = reference_randint(key, (5, 9), lo, hi)
    got = dq.jit(lambda k: R.randint(k, (5, 9), lo, hi), target=target)(key)
    np.testing.assert_array_equal(got, want)
    bounds = dq.jit(lambda k, a, b: R.randint(k, (5, 9), a, b), target=target)
    got = bounds(key, np.full((5, 1), lo, np.int32), np.full((9,), hi, np.int32))
    np.testing.assert_array_equal(got, want)  # traced bounds, broadcast to the shape
    assert got.dtype == np.int32 and (lo >= hi or (got.min() >= lo and got.max() < hi))


def test_randint_and_permutation_are_jaxs():
    jax = pytest.importorskip("jax")
    if not jax.config.jax_threefry_partitionable:
        pytest.skip("this JAX draws with the original (non-partitionable) threefry layout")
    key, jkey = R.key(3), jax.random.PRNGKey(3)
    for lo, hi in BOUNDS:
        want = np.asarray(jax.random.randint(jkey, (4, 7), lo, hi))
        np.testing.assert_array_equal(R.randint(key, (4, 7), lo, hi), want)
    x = np.arange(24, dtype=np.int32).reshape(4, 6)
    for n in (1, 5, 100, 2000):  # 2000 elements take JAX's two sorting rounds
        want = np.asarray(jax.random.permutation(jkey, n))
        np.testing.assert_array_equal(R.permutation(key, n), want)
    step = dq.jit(
        lambda k, x: [R.permutation(k, x, a, i) for a in (0, 1) for i in (False, True)],
        target="cpu",
    )
    got = step(key, x)
    want = [jax.random.permutation(jkey, x, a, i) for a in (0, 1) for i in (False, True)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, np.asarray(w))


def test_the_same_ints_on_every_target_and_thread_count(monkeypatch):
    import fake_cupy

    key = R.key(99)

    def draw(k):
        return R.randint(k, (300, 7), -1000, 77_777), R.permutation(k, 300)

    want = draw(key)  # eagerly, numpy
    for threads in ("1", "3"):
        monkeypatch.setenv("DLVM_EQ_NUM_THREADS", threads)
        config.reload()
        for got, w in zip(dq.jit(draw, target="cpu")(key), want):
            np.testing.assert_array_equal(got, w)
    for got, w in zip(dq.jit(draw, target="interp")(key), want):
        np.testing.assert_array_equal(got, w)
    with fake_cupy.installed(monkeypatch, sms=1) as cp:
        got = dq.jit(lambda k: R.randint(k, (3, 37), 0, 1_000_003), target="gpu")(cp.asarray(key))
        got = got.get()
    np.testing.assert_array_equal(got, reference_randint(key, (3, 37), 0, 1_000_003))


def test_draws_look_uniform():
    draws = dq.jit(lambda k: R.randint(k, (100_000,), -3, 7))(R.key(5))
    counts = np.bincount(draws + 3, minlength=10)
    assert counts.sum() == 100_000 and len(counts) == 10
    chi2 = ((counts - 10_000) ** 2 / 10_000).sum()
    assert chi2 < 27.9  # 9 degrees of freedom, p = 0.001
    # permutations: each a permutation; where element 0 lands is uniform over 8 places
    keys = R.split(R.key(8), 4000)
    perms = dq.jit(lambda ks: [R.permutation(ks[i], 8) for i in range(40)])(keys[:40])
    perms += [R.permutation(keys[i], 8) for i in range(40, 400)]
    landed = np.zeros(8, int)
    for p in perms:
        assert sorted(p) == list(range(8))
        landed[int(np.flatnonzero(np.asarray(p) == 0)[0])] += 1
    chi2 = ((landed - 50) ** 2 / 50).sum()
    assert chi2 < 24.3  # 7 degrees of freedom, p = 0.001
    assert len({tuple(p) for p in perms}) > 390  # 8! = 40320 orders: few repeats


def test_user_mistakes_are_located_errors():
    key = R.key(0)
    with pytest.raises(DlvmError, match="i32"):
        R.randint(key, (3,), 0, 5, dtype="f32")
    with pytest.raises(DlvmError, match="minval must be an integer"):
        dq.jit(lambda k, a: R.randint(k, (3,), a, 5))(key, np.zeros(3, np.float32))
    with pytest.raises(DlvmError, match="at least one-dimensional"):
        R.permutation(key, np.float32(2.0))
    with pytest.raises(DlvmError, match="at most 16384"):
        R.permutation(key, 60_000)  # a located error, not an n x n allocation
    with pytest.raises(DlvmError, match="key has shape"):
        R.permutation(np.zeros(3, np.int32), 4)
