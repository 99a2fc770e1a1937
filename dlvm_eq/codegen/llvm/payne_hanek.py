"""Payne–Hanek reduction of a large f64 argument by pi/2, branch-free, so a vectorized loop
computes it for every lane and selects (polymath's trig uses it above REDUCE_LIMIT, where its
Cody–Waite reduction loses bits: sin(1e22) was 1.6e8 and sin(1e300) inf).

x (f64, |x| >= 2**20) is split into three 24-bit integers m0 m1 m2 times powers of two, and
2/pi into 24-bit integers T[k] (2/pi = sum T[k] 2**(-24(k+1))), so that
x * 2/pi = sum_j P_j 2**E_j with P_j = sum_i m_i T[j-i] exact in f64 (< 2**50). Terms with
E_j >= 2 are multiples of 4 and drop out of the quadrant; the next seven are each reduced mod 4
exactly and summed in double-double (error ~2**-100, far below an f64 ulp of r). An f32
argument (24-bit mantissa m) reads one precomputed row instead: (2/pi 2**(e-23)) mod 4 in three
29-bit pieces, so x * 2/pi mod 4 is three exact products (error < 2**-61, enough for f32).
Cost: every lane computes both reductions; f32 sin measured ~3x slower on 4M elements (a
shared 2-core machine: 45 -> 140 ms), the price of being right beyond 2**20.

    >>> r, q = reduce_large(e, x)     # x = (n + r / (pi/2)) * pi/2 ... with q = n mod 4 (0..3)
"""

from __future__ import annotations

import math

from llvmlite import ir

from .emitter import F64, I64, Emitter

REDUCE_LIMIT = 2.0**20  # |x| below this: Cody-Waite (polymath), exact enough for n < 2**23
TERMS = 7  # P_j kept after the first term below 4 (each 24 bits further down)
CHUNKS = 50  # 24-bit chunks of 2/pi: enough for the largest f64 exponent (1023) plus TERMS
PAD = 2  # zeros before the chunks: P_j reads T[j - 2] for j >= 0


def _pi_bits(bits: int) -> int:
    """floor(pi * 2**bits), Machin's formula in integers (with guard bits)."""
    guard = bits + 32
    one = 1 << guard

    def arctan_inv(n: int) -> int:  # atan(1/n) * 2**guard
        total, term, k, n2 = 0, one // n, 0, n * n
        while term:
            total += term // (2 * k + 1) if k % 2 == 0 else -(term // (2 * k + 1))
            term //= n2
            k += 1
        return total

    return (16 * arctan_inv(5) - 4 * arctan_inv(239)) >> 32


def two_over_pi_chunks(count: int = CHUNKS) -> tuple[int, ...]:
    """The first `count` 24-bit chunks of 2/pi's binary fraction (2/pi < 1)."""
    bits = 24 * count
    guard = bits + 64
    pi = _pi_bits(guard)  # pi * 2**guard
    scaled = (
        1 << (bits + guard + 1)
    ) // pi  # floor(2/pi * 2**bits), the guard bits absorb pi's error
    return tuple((scaled >> (24 * (count - 1 - k))) & 0xFFFFFF for k in range(count))


_TABLE = (0.0,) * PAD + tuple(float(c) for c in two_over_pi_chunks())
F32_EXPONENTS = range(20, 128)  # the binary exponents of f32 values at or above REDUCE_LIMIT
F32_CHUNKS, F32_BITS = 3, 29  # per exponent: 2/pi * 2**(e - 23) mod 4 in 29-bit pieces


def f32_table() -> tuple[float, ...]:
    """Row e - 20: (2**(e-23) * 2/pi) mod 4 as F32_CHUNKS floats of F32_BITS bits each, from
    2**1 down, so that m * chunk is exact for a 24-bit integer m (an f32 mantissa)."""
    bits = 24 * CHUNKS
    scaled = 0
    for c in two_over_pi_chunks():
        scaled = (scaled << 24) | c  # floor(2/pi * 2**bits)
    low = 2 - F32_CHUNKS * F32_BITS  # bits 2**1 .. 2**low: 116 bits, the units and 2s kept
    out = []
    for ex in F32_EXPONENTS:
        w = (scaled << (ex - 23 - low)) >> bits  # (2/pi * 2**(ex-23)) / 2**low, floored
        w &= (1 << (F32_CHUNKS * F32_BITS)) - 1  # mod 4
        for j in range(F32_CHUNKS):
            shift = (F32_CHUNKS - 1 - j) * F32_BITS
            out.append(math.ldexp(float((w >> shift) & ((1 << F32_BITS) - 1)), shift + low))
    return tuple(out)


def _table(e: Emitter, name: str, values) -> ir.GlobalVariable:
    """A constant table as a global of the module (global memory on NVPTX)."""
    module = e.module
    table = module.globals.get(name)
    if table is None:
        space = 1 if str(module.triple).startswith("nvptx") else 0
        t = ir.ArrayType(F64, len(values))
        table = ir.GlobalVariable(module, t, name, addrspace=space)
        table.global_constant = True
        table.linkage = "internal"
        table.initializer = ir.Constant(t, list(values))
    return table


def _pow2(e: Emitter, k):
    """2.0**k for an i64 k in the normal range, by building its bits."""
    biased = e.b.add(k, ir.Constant(I64, 1023))
    return e.b.bitcast(e.b.shl(biased, ir.Constant(I64, 52)), F64)


def _mod4(e: Emitter, t):
    """t mod 4 for t = P * 2**E (P < 2**50 an integer): exact, no contraction needed."""
    b = e.b
    return b.fsub(t, b.fmul(b.call(_floor(e), [b.fmul(t, ir.Constant(F64, 0.25))]), _c(4.0)))


def _floor(e: Emitter) -> ir.Function:
    return e.declare("llvm.floor.f64", F64, [F64])


def _c(v: float) -> ir.Constant:
    return ir.Constant(F64, v)


def _exponent(e: Emitter, a, top: int):
    """The binary exponent of a >= REDUCE_LIMIT as i64, clamped to [20, top] so that lanes the
    caller discards (small, inf, NaN) still index the tables in range."""
    b = e.b
    ex = b.sub(b.lshr(b.bitcast(a, I64), ir.Constant(I64, 52)), ir.Constant(I64, 1023))
    ex = b.select(b.icmp_signed("<", ex, ir.Constant(I64, 20)), ir.Constant(I64, 20), ex)
    return b.select(b.icmp_signed(">", ex, ir.Constant(I64, top)), ir.Constant(I64, top), ex)


def _load(e: Emitter, table, index):
    zero = ir.Constant(ir.IntType(32), 0)
    return e.b.load(e.b.gep(table, [zero, index], inbounds=True))


def reduce_large(e: Emitter, x, from_f32: bool = False):
    """(r, q) with x = (4k + q) * pi/2 + r, |r| <= ~pi/4, q a float in 0..3, for
    REDUCE_LIMIT <= |x| < inf (other lanes get finite garbage the caller selects away).
    from_f32: x holds an f32 value (24-bit mantissa): one table row per exponent, 4 products."""
    return _finish(e, x, (_parts_f32 if from_f32 else _parts_f64)(e, e.intrinsic("fabs", x)))


def _parts_f32(e: Emitter, a) -> list:
    """m * row[j] mod 4 for |x| = m 2**(ex-23): sum to |x| * 2/pi mod 4."""
    b = e.b
    ex = _exponent(e, a, F32_EXPONENTS[-1])
    m = b.fmul(a, _pow2(e, b.sub(ir.Constant(I64, 23), ex)))  # the 24-bit integer mantissa
    table = _table(e, "dlvm_eq_two_over_pi_f32", f32_table())
    row = b.mul(b.sub(ex, ir.Constant(I64, F32_EXPONENTS[0])), ir.Constant(I64, F32_CHUNKS))
    return [
        _mod4(e, b.fmul(m, _load(e, table, b.add(row, ir.Constant(I64, j)))))
        for j in range(F32_CHUNKS)
    ]


def _parts_f64(e: Emitter, a) -> list:
    """P_j 2**E_j mod 4 for the TERMS first j with E_j < 2 (module docstring)."""
    b = e.b
    floor = _floor(e)
    s = b.sub(_exponent(e, a, 1023), ir.Constant(I64, 23))  # a = m0 2**s + m1 2**(s-24) + ...
    y = b.fmul(a, _pow2(e, b.neg(s)))  # in [2**23, 2**24): scaling is exact
    m0 = b.call(floor, [y])
    y1 = b.fmul(b.fsub(y, m0), _c(2.0**24))
    m1 = b.call(floor, [y1])
    m2 = b.fmul(b.fsub(y1, m1), _c(2.0**24))
    # first j whose E_j = s - 24 (j + 1) is below 2: j0 = max(0, floor((s - 26) / 24) + 1)
    j0 = b.sub(b.udiv(b.add(s, ir.Constant(I64, 22)), ir.Constant(I64, 24)), ir.Constant(I64, 1))
    j0 = b.select(b.icmp_signed("<", j0, ir.Constant(I64, 0)), ir.Constant(I64, 0), j0)
    table = _table(e, "dlvm_eq_two_over_pi", _TABLE)
    parts = []
    for d in range(TERMS):
        j = b.add(j0, ir.Constant(I64, d + PAD))  # index of T[j] in the padded table
        p = b.fmul(m0, _load(e, table, j))
        p = b.fadd(p, b.fmul(m1, _load(e, table, b.sub(j, ir.Constant(I64, 1)))))
        p = b.fadd(p, b.fmul(m2, _load(e, table, b.sub(j, ir.Constant(I64, 2)))))
        exp_j = b.sub(s, b.mul(b.add(j0, ir.Constant(I64, d + 1)), ir.Constant(I64, 24)))
        parts.append(_mod4(e, b.fmul(p, _pow2(e, exp_j))))
    return parts


def _finish(e: Emitter, x, parts):
    """(r, q) from exact parts of |x| * 2/pi mod 4, summed in double-double, signed as x."""
    b = e.b
    floor = _floor(e)
    hi, lo = parts[0], _c(0.0)
    for u in parts[1:]:
        total = b.fadd(hi, u)  # two-sum: hi + u = total + err exactly
        back = b.fsub(total, hi)
        err = b.fadd(b.fsub(hi, b.fsub(total, back)), b.fsub(u, back))
        hi, lo = total, b.fadd(lo, err)
    n = e.intrinsic("rint", hi)
    f = b.fadd(b.fsub(hi, n), lo)  # x * 2/pi - n, |f| <= ~1/2
    r = b.fmul(f, _c(math.pi / 2))
    q = b.fsub(n, b.fmul(b.call(floor, [b.fmul(n, _c(0.25))]), _c(4.0)))
    # x < 0: x = -(n pi/2 + r) = (-n) pi/2 - r
    neg = b.fcmp_ordered("<", x, _c(0.0))
    q_neg = b.select(b.fcmp_ordered("==", q, _c(0.0)), q, b.fsub(_c(4.0), q))
    return b.select(neg, b.fneg(r), r), b.select(neg, q_neg, q)
