"""Whole pooling windows, taps unrolled, for specs without padding (cpu/pool_ir.py): one loop
over a row's outputs reads each window once, keeps its maximum or sum in registers and, for a
backward op, writes every position of the window in the same iteration.

Where the windows tile the columns (stride == kernel width) they are computed several at a
time with explicit vectors: each tap row of those windows is one contiguous vector load,
split into per-tap vectors by shuffles (and put back together the same way to be stored).
LLVM's own vectorizer declines these loops on AVX2 (its cost model prices the interleaved
stores of a backward window too high: measured scalar and branchy, 5-10x slower); the shuffles
are what it would have emitted for the loads.

    >>> window_row(pe, oy, lambda b, win: win.store_out(y_row, first_max(pe, win.taps(x))[0]))
"""

from __future__ import annotations

from llvmlite import ir

from ..llvm.emitter import I32
from ..llvm.loops import counted_loop, i64

VECTOR_BYTES = 64  # LANES = VECTOR_BYTES / element size: two AVX2 registers, one AVX-512


def splat(t: ir.Type, v, like) -> ir.Constant:
    """Constant v of scalar type t, with as many lanes as `like` has (none for a scalar)."""
    if isinstance(like.type, ir.VectorType):
        return ir.Constant(ir.VectorType(t, like.type.count), [v] * like.type.count)
    return ir.Constant(t, v)


class Windows:
    """The windows at outputs (oy, ox .. ox + lanes - 1) of one plane (lanes 0: one window,
    scalars); pe is the kernel's PoolEmitter."""

    def __init__(self, pe, oy, ox, lanes: int = 0):
        self.pe, self.b, self.oy, self.ox, self.lanes = pe, pe.b, oy, ox, lanes
        b = self.b
        base = b.add(b.mul(oy, i64(pe.sh * pe.w)), b.mul(ox, i64(pe.sw)))
        self.rows = [
            b.add(base, i64(i * pe.w)) for i in range(pe.kh)
        ]  # each tap row's first offset

    def _vec_ptr(self, a, off):
        return self.pe.ptr(a, off)

    def _mask(self, idx):
        return ir.Constant(ir.VectorType(I32, len(idx)), list(idx))

    def taps(self, a) -> list:
        """The windows' values of (H, W) plane a, tap by tap in row-major order."""
        pe, b, kw, n = self.pe, self.b, self.pe.kw, self.lanes
        if not n:
            return [pe.load(a, b.add(r, i64(j))) for r in self.rows for j in range(kw)]
        out = []
        for r in self.rows:
            row = b.load(self._vec_ptr(a, r), typ=ir.VectorType(pe.T, n * kw), align=pe.itemsize)
            out += [
                row
                if kw == 1
                else b.shuffle_vector(row, row, self._mask([lane * kw + j for lane in range(n)]))
                for j in range(kw)
            ]
        return out

    def store_taps(self, a, vals) -> None:
        """(H, W) plane a at every position of the windows = vals (as taps() orders them)."""
        pe, b, kw, n = self.pe, self.b, self.pe.kw, self.lanes
        if not n:
            for i, r in enumerate(self.rows):
                for j in range(kw):
                    pe.store(vals[i * kw + j], a, b.add(r, i64(j)))
            return
        for i, r in enumerate(self.rows):
            row = self._interleave(vals[i * kw : (i + 1) * kw])
            b.store(row, self._vec_ptr(a, r), align=pe.itemsize)

    def _interleave(self, parts):
        """One vector whose element lane * kw + j is parts[j][lane]."""
        b, n, kw = self.b, self.lanes, len(parts)
        if kw == 1:
            return parts[0]
        vs = list(parts)
        while len(vs) > 1:  # concatenate pairwise (padding the odd one out)
            if len(vs) % 2:
                vs.append(ir.Constant(vs[0].type, None))
            m = vs[0].type.count
            vs = [
                b.shuffle_vector(vs[k], vs[k + 1], self._mask(range(2 * m)))
                for k in range(0, len(vs), 2)
            ]
        whole = vs[0]
        return b.shuffle_vector(
            whole, whole, self._mask([j * n + lane for lane in range(n) for j in range(kw)])
        )

    def at_out(self, a):
        """The (OH, OW)-row a (already offset to row oy) at the windows' outputs."""
        if not self.lanes:
            return self.pe.load(a, self.ox)
        return self.b.load(
            self._vec_ptr(a, self.ox),
            typ=ir.VectorType(self.pe.T, self.lanes),
            align=self.pe.itemsize,
        )

    def store_out(self, a, v) -> None:
        if not self.lanes:
            self.pe.store(v, a, self.ox)
            return
        self.b.store(v, self._vec_ptr(a, self.ox), align=self.pe.itemsize)

    def zero(self, like):
        return splat(self.pe.T, 0.0, like)


def first_max(pe, vals):
    """(maximum, i32 tap index of its first occurrence) of values in tap order."""
    b = pe.b
    best, at = vals[0], splat(I32, 0, vals[0])
    for t, v in enumerate(vals[1:], 1):
        take = pe.takes(v, best)
        best, at = b.select(take, v, best), b.select(take, splat(I32, t, v), at)
    return best, at


def pick(pe, at, vals):
    """vals[at] for i32 tap indices `at`, as selects."""
    b, got = pe.b, vals[0]
    for t, v in enumerate(vals[1:], 1):
        got = b.select(b.icmp_signed("==", at, splat(I32, t, at)), v, got)
    return got


def window_row(pe, oy, body) -> None:
    """body(b, win) for the windows of output row oy: where windows tile the columns, blocks of
    `lanes` windows (a power of two, at most VECTOR_BYTES of elements and at most the row), the
    last block ending at the row's end and so overlapping the one before when the row is not a
    multiple of lanes: its windows are computed and written twice, to the same values, and
    nothing outside the row is touched (no masks). Else one window at a time."""
    lanes = min(VECTOR_BYTES // pe.itemsize, 1 << (pe.ow.bit_length() - 1)) if pe.sw == pe.kw else 1
    if lanes < 2:
        counted_loop(pe.b, i64(0), i64(pe.ow), lambda b, ox: body(b, Windows(pe, oy, ox)), "win")
        return
    counted_loop(
        pe.b,
        i64(0),
        i64(pe.ow // lanes),
        lambda b, k: body(b, Windows(pe, oy, b.mul(k, i64(lanes)), lanes)),
        "winv",
    )
    if pe.ow % lanes:
        body(pe.b, Windows(pe, oy, i64(pe.ow - lanes), lanes))
