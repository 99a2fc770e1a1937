"""Counter-based random numbers with JAX's keys and bits: a key is two 32-bit words (here an
i32 array of shape (2,), the bits of jax.random.PRNGKey's uint32 pair), and every number is
threefry2x32 (Salmon et al., Random123; 20 rounds) of the key and the element's index, so the
bits do not depend on the target or the thread count:

    key = dq.random.key(0)
    k1, k2 = dq.random.split(key)
    u = dq.random.uniform(k1, (3, 4))                 # f32 in [0, 1), JAX's values
    z = dq.random.normal(k2, (3, 4))                  # sqrt(2) erfinv(u in (-1, 1)), as JAX
    keep = dq.random.bernoulli(dq.random.fold_in(key, 7), 0.9, (3, 4))
    labels = dq.random.randint(k1, (8,), 0, 10)       # i32 in [0, 10), JAX's values
    order = dq.random.permutation(k2, 100)            # JAX's shuffle of range(100)

Bits, uniform, bernoulli, randint and permutation are the same bits on interp, cpu and gpu;
normal is within 4 ulp of the interpreter's on cpu (erfinv's log1p and sqrt are the kernels'
polynomials there, numpy's in the interpreter) and the same bits for any thread count.

Keys and counters follow JAX's partitionable threefry (`jax_threefry_partitionable`, JAX's
default): element i of a draw is threefry(key, (0, i)) with its two words xored, split(key, n)
gives the pairs threefry(key, (0, i)), fold_in(key, d) the pair threefry(key, (0, d)). Draws
have fewer than 2**31 elements. Words are i32 in the IR: xor, shiftLeft, shiftRightLogical and
wrapping add are the ops that read them as unsigned.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.types import F32, F64, I32
from . import ops
from .constants import arange
from .context import shape_error
from .gather import take
from .ops import normalize_axes, shape_of
from .primitive import bind, dtype_of, to_dtype
from .shapes import take_along_axis
from .sorting import argsort

ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
PARITY = 0x1BD11BDA  # the key schedule's constant (Threefish)


def _xor(a, b):
    return bind("xor", [a, b], name="random")


def _rotl(x, r: int):
    """x rotated left by r bits (the two shifted parts have no bit in common)."""
    left = bind("shiftLeft", [x, r], name="random")
    return _xor(left, bind("shiftRightLogical", [x, 32 - r], name="random"))


def threefry2x32(key, x0, x1):
    """(y0, y1): threefry2x32 with 20 rounds of the counter words x0, x1 (i32 arrays of one
    shape) under the key's two words, as jax.random's threefry_2x32."""
    k0, k1 = ops.reshape(key[0:1], ()), ops.reshape(key[1:2], ())
    ks = (k0, k1, _xor(_xor(k0, k1), PARITY))
    x0, x1 = ops.add(x0, ks[0]), ops.add(x1, ks[1])
    for i in range(5):
        for r in ROTATIONS[i % 2]:
            x0 = ops.add(x0, x1)
            x1 = _xor(_rotl(x1, r), x0)
        x0 = ops.add(x0, ks[(i + 1) % 3])
        x1 = ops.add(ops.add(x1, ks[(i + 2) % 3]), i + 1)
    return x0, x1


def _words(value: int) -> tuple[int, int]:
    """The high and low 32-bit words of a non-negative int, as i32 values."""
    hi, lo = (value >> 32) & 0xFFFFFFFF, value & 0xFFFFFFFF
    return int(np.array(hi, np.uint32).view(np.int32)), int(np.array(lo, np.uint32).view(np.int32))


def key(seed: int):
    """A key from an integer seed, as jax.random.PRNGKey (the seed's two 32-bit words)."""
    seed = int(seed)
    if -(2**31) <= seed < 2**32:  # a 32-bit seed: (0, its word), as JAX without x64
        return np.array(_words(seed & 0xFFFFFFFF), np.int32)
    return np.array(_words(seed & 0xFFFFFFFFFFFFFFFF), np.int32)  # 64 bits: JAX with x64


PRNGKey = key


def _check_key(k):
    if tuple(shape_of(k)) != (2,):
        raise shape_error(f"random: a key has shape (2,), got {tuple(shape_of(k))}")


def _counters(n: int):
    if n >= 2**31:
        raise shape_error(f"random: {n} numbers in one draw; at most 2**31 - 1")
    return ops.multiply(arange(n), 0), arange(n)  # (high word, low word) of each index


def split(k, num: int = 2):
    """`num` new keys, shape (num, 2), as jax.random.split."""
    _check_key(k)
    y0, y1 = threefry2x32(k, *_counters(int(num)))
    return ops.concatenate([ops.reshape(y0, (num, 1)), ops.reshape(y1, (num, 1))], axis=1)


def fold_in(k, data: int):
    """A new key from k and an integer, as jax.random.fold_in."""
    _check_key(k)
    hi, lo = _words(int(data) & 0xFFFFFFFF)
    y0, y1 = threefry2x32(k, np.array([hi], np.int32), np.array([lo], np.int32))
    return ops.concatenate([y0, y1])


def bits(k, shape):
    """32 random bits per element (i32), as jax.random.bits with the partitionable threefry."""
    _check_key(k)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    y0, y1 = threefry2x32(k, *_counters(math.prod(shape)))
    return ops.reshape(_xor(y0, y1), shape)


def uniform(k, shape=(), dtype=F32, minval=0.0, maxval=1.0):
    """Floats in [minval, maxval), as jax.random.uniform: the top 23 bits (f32) as k 2**-23."""
    dtype = to_dtype(dtype)
    mantissa = 23 if dtype is F32 else 52
    if mantissa > 31:  # an f64 needs 52 random bits: two draws' words are not JAX's layout
        raise shape_error("random.uniform: f32 only (JAX's f64 draws use 64-bit words)")
    top = bind("shiftRightLogical", [bits(k, shape), 32 - mantissa], name="uniform")
    unit = ops.multiply(ops.astype(top, dtype), 2.0**-mantissa)  # exact: top < 2**23
    scaled = ops.add(ops.multiply(unit, maxval - minval), minval)
    return ops.maximum(scaled, minval)


def _erfinv(x):
    """erfinv in single precision: Giles' polynomials (2010), as XLA's ErfInv for f32."""
    w = ops.negative(ops.log1p(ops.negative(ops.multiply(x, x))))
    small = ops.less(w, 5.0)
    a = ops.subtract(ops.where(small, w, 5.0), 2.5)
    b = ops.subtract(ops.sqrt(ops.where(small, 5.0, w)), 3.0)
    pa = _horner(a, _GILES_SMALL)
    pb = _horner(b, _GILES_LARGE)
    return ops.multiply(ops.where(small, pa, pb), x)


_GILES_SMALL = (
    2.81022636e-08,
    3.43273939e-07,
    -3.5233877e-06,
    -4.39150654e-06,
    0.00021858087,
    -0.00125372503,
    -0.00417768164,
    0.246640727,
    1.50140941,
)
_GILES_LARGE = (
    -0.000200214257,
    0.000100950558,
    0.00134934322,
    -0.00367342844,
    0.00573950773,
    -0.0076224613,
    0.00943887047,
    1.00167406,
    2.83297682,
)


def _horner(x, coeffs):
    acc = coeffs[0]
    for c in coeffs[1:]:
        acc = ops.add(ops.multiply(acc, x), c)
    return acc


def normal(k, shape=(), dtype=F32):
    """Standard normal floats, as jax.random.normal: sqrt(2) erfinv(u), u uniform in (-1, 1)."""
    lo = float(np.nextafter(np.float32(-1.0), np.float32(0.0)))
    u = uniform(k, shape, dtype, minval=lo, maxval=1.0)
    return ops.multiply(math.sqrt(2.0), _erfinv(u))


def bernoulli(k, p=0.5, shape=()):
    """Bools that are True with probability p, as jax.random.bernoulli (uniform < p)."""
    return ops.less(uniform(k, shape), p)


def dropout(k, rate, x):
    """x with each element zeroed with probability `rate` and the rest scaled by 1 / (1 - rate)
    (inverted dropout, as flax's Dropout and torch's); rate 0 returns x."""
    if not 0.0 <= rate < 1.0:
        raise shape_error(f"dropout: rate must be in [0, 1), got {rate!r}")
    if rate == 0.0:
        return x
    keep = bernoulli(k, 1.0 - rate, tuple(shape_of(x)))
    return ops.where(keep, ops.divide(x, 1.0 - rate), 0.0)


_WORD = 2.0**32  # unsigned 32-bit words are exact in f64, and so is their arithmetic here


def _unsigned(w):
    """An i32 word read as unsigned, in f64."""
    f = ops.astype(w, F64)
    return ops.where(ops.less(w, 0), ops.add(f, _WORD), f)


def _to_word(v):
    """An integral f64 in [0, 2**32) as the i32 word with those bits."""
    return ops.astype(ops.where(ops.less(v, 2.0**31), v, ops.subtract(v, _WORD)), I32)


def _umod(x, span):
    """x mod span for integral f64 x < 2**53 and span <= 2**32: exact, since x / span is never
    rounded across an integer at these sizes (floor is then the integer quotient)."""
    return ops.subtract(x, ops.multiply(ops.floor(ops.divide(x, span)), span))


def _bound(value, name: str):
    """(minval or maxval as f64, whether it lies above the i32 range): Python ints are clipped
    to i32 as JAX clips them to the dtype; i32 tensors are in range."""
    if isinstance(value, (int, np.integer)):
        v = int(value)
        return float(min(max(v, -(2**31)), 2**31 - 1)), v > 2**31 - 1
    if dtype_of(value) is not I32:
        raise shape_error(f"random.randint: {name} must be an integer, got {dtype_of(value)}")
    return ops.astype(value, F64), False


def randint(k, shape, minval, maxval, dtype=I32):
    """i32 in [minval, maxval), as jax.random.randint bit for bit: two 32-bit draws (keys
    split(k)) combined as (hi mod span) * (2**32 mod span) + lo mod span, all mod span, with
    JAX's wrapping uint32 product and sum. minval and maxval are ints or i32 arrays that
    broadcast to `shape`; maxval <= minval gives minval."""
    _check_key(k)
    if to_dtype(dtype) is not I32:
        raise shape_error(f"random.randint: the IR's only integer dtype is i32, got {dtype}")
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    (lo, lo_above), (hi, hi_above) = _bound(minval, "minval"), _bound(maxval, "maxval")
    if lo_above:  # minval clipped to the largest i32: every draw is that value
        return ops.add(ops.multiply(bits(k, shape), 0), 2**31 - 1)
    keys = split(k)
    high, low = bits(keys[0], shape), bits(keys[1], shape)
    if isinstance(lo, float) and isinstance(hi, float):  # both static: span in Python
        span = 1.0 if hi <= lo else hi - lo + (1.0 if hi_above else 0.0)
        m = ((2**16 % int(span)) ** 2 % 2**32) % int(span)  # JAX squares in uint32
        multiplier = int(np.array(m, np.uint32).view(np.int32))
    else:
        span = ops.where(ops.less_equal(hi, lo), 1.0, ops.subtract(hi, lo))
        span = ops.add(span, ops.multiply(ops.astype(ops.greater(hi, lo), F64), float(hi_above)))
        small = _umod(ops.add(ops.multiply(span, 0.0), 2.0**16), span)
        multiplier = _to_word(_umod(_umod(ops.square(small), _WORD), span))  # uint32 square
    # JAX computes in uint32: the product and sum below wrap mod 2**32, as i32 words do
    words = ops.add(
        ops.multiply(_to_word(_umod(_unsigned(high), span)), multiplier),
        _to_word(_umod(_unsigned(low), span)),
    )
    return ops.astype(ops.add(_umod(_unsigned(words), span), lo), I32)


def permutation(k, x, axis=0, independent=False):
    """A random permutation of range(x) (an int) or of x along `axis`, as
    jax.random.permutation bit for bit: JAX's shuffle, stable sorts by fresh 32-bit keys (one
    round below about 1600 elements, more above). `independent` shuffles each slice along
    `axis` on its own. The sort counts ranks (dq.argsort): n x n comparisons per row."""
    _check_key(k)
    if isinstance(x, (int, np.integer)):
        return _shuffle(k, arange(int(x)), 0)
    shape = tuple(shape_of(x))
    if not shape:
        raise shape_error("random.permutation: x must be an int or at least one-dimensional")
    (axis,) = normalize_axes(axis, shape, "random.permutation")
    if independent or len(shape) == 1:
        return _shuffle(k, x, axis)
    return take(x, _shuffle(k, arange(shape[axis]), 0), axis=axis)


PERMUTATION_LIMIT = 2**14  # the sort compares n x n: 2**28 comparisons per row at the limit


def _shuffle(k, x, axis: int):
    size = math.prod(shape_of(x))
    n = tuple(shape_of(x))[axis]
    if n > PERMUTATION_LIMIT:
        raise shape_error(
            f"random.permutation: {n} entries along the axis; at most {PERMUTATION_LIMIT} (its "
            "sort compares every pair); shuffle longer axes outside the step (numpy's "
            "permutation) or in blocks"
        )
    rounds = int(np.ceil(3 * np.log(max(1, size)) / np.log(2**32 - 1)))  # JAX's count
    for _ in range(rounds):
        keys = split(k)
        k, sub = keys[0], keys[1]
        order = _xor(bits(sub, tuple(shape_of(x))), -(2**31))  # unsigned order as signed
        x = take_along_axis(x, argsort(order, axis=axis), axis)
    return x
