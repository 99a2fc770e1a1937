"""LLVM IR for a PoolSpec on the host (`pool_ir`; the GPU version is `gpu/pool_ptx.py`).

ABI: void k(i64 p0, i64 p1, ptr out, ptr in_0, ptr in_1) runs planes [p0, p1) (in_1 is
ignored by one-operand ops); threads take ranges of planes, each plane written by one call
only, so backward ops need no atomics and results do not depend on the thread count.

Per output row oy the window taps are swept in row-major order, each tap as one loop over the
row's outputs ox (the valid range of ox clipped so that no padded position is read): the loop
reads x with stride sw and the row of running maxima / sums contiguously, so LLVM vectorizes
it. Max ops keep, beside the maximum, the plane offset of the first maximum (-1: a padded
tap) in a stack row; the gather then reads g there, the backward op routes dY there:
- non-overlapping windows (stride >= kernel): every input position is written once, directly
  (dY where it is the window's argmax, else 0); rows and columns no window covers are zeroed;
- overlapping windows: the plane is zeroed, then each window adds its dY at its argmax.
avgPool2dBackward writes or adds dY / (kh * kw) the same two ways. Without padding and with
few taps, windows are instead computed whole, taps unrolled, several at a time with explicit
vectors where they tile the columns (cpu/pool_windows.py): the CNN's 2x2 pools take that path.

    >>> kir = pool_ir(pool_spec("maxPool2d", attrs, (28, 28), "f32"))   # kir.text: the module
"""

from __future__ import annotations

from llvmlite import ir

from ..kernels.pool_spec import PoolSpec
from ..llvm.emitter import F32, F64, I32, I64, Emitter
from ..llvm.loops import counted_loop, i64
from .llvm_cpu import CpuIR, mark_noalias, symbol_for, target_machine
from .pool_windows import first_max, pick, splat, window_row

PTR = ir.PointerType()
UNROLLED_TAPS = 16  # windows of at most this many taps are computed whole (see unrolled())


class PoolEmitter:
    """The pieces every pooling kernel is made of, on one builder: integer helpers, element
    loads and stores, and the sweep over a row's window taps. Shared with the GPU back end,
    whose index type may be i32 (`t`)."""

    def __init__(self, b: ir.IRBuilder, spec: PoolSpec, t: ir.IntType = I64):
        self.b, self.spec, self.t = b, spec, t
        self.e = Emitter(b)
        self.T = F32 if spec.dtype == "f32" else F64
        self.itemsize = 4 if spec.dtype == "f32" else 8
        (self.h, self.w), (self.kh, self.kw) = spec.hw, spec.kernel
        (self.sh, self.sw), (self.pt, _, self.pl, _) = spec.stride, spec.padding
        self.oh, self.ow = spec.out_hw

    def c(self, v: int) -> ir.Constant:
        return ir.Constant(self.t, v)

    def fc(self, v: float) -> ir.Constant:
        return ir.Constant(self.T, v)

    def imax(self, a, c):
        return self.b.select(self.b.icmp_signed(">", a, c), a, c)

    def imin(self, a, c):
        return self.b.select(self.b.icmp_signed("<", a, c), a, c)

    def between(self, v, lo: int, hi: int):
        """lo <= v < hi (signed)."""
        b = self.b
        return b.and_(b.icmp_signed(">=", v, self.c(lo)), b.icmp_signed("<", v, self.c(hi)))

    def ptr(self, base, idx):
        return self.b.gep(base, [idx], inbounds=True, source_etype=self.T)

    def load(self, base, idx):
        return self.b.load(self.ptr(base, idx), typ=self.T)

    def store(self, v, base, idx):
        self.b.store(v, self.ptr(base, idx))

    def takes(self, v, best):
        """Whether tap value v replaces the running maximum `best`: strictly greater, or the
        first NaN (numpy's max propagates NaN, its argmax picks the first one)."""
        e, b = self.e, self.b
        return b.or_(e.fcmp(">", v, best), b.and_(e.isnan(v), b.fcmp_ordered("ord", best, best)))

    def tap0_offset(self, oy, ox):
        """Plane offset of the window's first tap, or -1 where that tap is padding."""
        b = self.b
        iy = b.sub(b.mul(oy, self.c(self.sh)), self.c(self.pt))
        ix = b.sub(b.mul(ox, self.c(self.sw)), self.c(self.pl))
        real = b.and_(self.between(iy, 0, self.h), self.between(ix, 0, self.w))
        return b.select(real, b.add(b.mul(iy, self.c(self.w)), ix), self.c(-1))

    def ox_range(self, j):
        """The outputs ox whose tap column j reads a real input column: [lo, hi)."""
        b, sw = self.b, self.c(self.sw)
        before = b.sub(self.c(self.pl), j)  # padded columns left of tap j's first read
        lo = b.select(
            b.icmp_signed(">", before, self.c(0)),
            b.udiv(b.add(before, self.c(self.sw - 1)), sw),
            self.c(0),
        )
        last = b.sub(self.c(self.w - 1 + self.pl), j)  # ox * sw <= last
        hi = b.select(
            b.icmp_signed(">=", last, self.c(0)), b.add(b.sdiv(last, sw), self.c(1)), self.c(0)
        )
        return lo, self.imin(hi, self.c(self.ow))

    def sweep_taps(self, oy, visit, row_start=None):
        """visit(b, off, ox) for every real tap of row oy's windows, taps in row-major order
        and, per tap, ox ascending; off is the plane offset the tap reads. row_start(b, iy)
        runs before the taps of each real input row iy."""

        def tap_row(b, i):
            iy = b.sub(b.add(b.mul(oy, self.c(self.sh)), i), self.c(self.pt))
            with b.if_then(self.between(iy, 0, self.h)):
                if row_start is not None:
                    row_start(b, iy)
                row = b.mul(iy, self.c(self.w))

                def tap_col(b, j):
                    lo, hi = self.ox_range(j)
                    shift = b.sub(j, self.c(self.pl))

                    def each(b, ox):
                        visit(b, b.add(row, b.add(b.mul(ox, self.c(self.sw)), shift)), ox)

                    counted_loop(b, lo, hi, each, "ox")

                counted_loop(b, self.c(0), self.c(self.kw), tap_col, "tapx")

        counted_loop(self.b, self.c(0), self.c(self.kh), tap_row, "tapy")


class _Plane(PoolEmitter):
    """The CPU kernel's body for one plane: rows of outputs, each swept tap by tap."""

    def __init__(self, b, spec, out, ins):
        super().__init__(b, spec)
        self.out, self.ins = out, ins
        if spec.reads_max and spec.op != "maxPool2d":
            self.best = self._row(self.T, "best")
            self.idx = self._row(I32, "argmax")
        if spec.op == "avgPool2dBackward":
            self.share = self._row(self.T, "share")

    def _row(self, t, name):
        with self.b.goto_entry_block():
            a = self.b.alloca(t, size=i64(self.ow), name=name)
        a.align = 64
        return a

    def fill(self, base, lo, hi, value):
        counted_loop(self.b, lo, hi, lambda b, k: self.store(value, base, k), "fill")

    def argmax_row(self, x, oy):
        """best[ox], idx[ox]: each window's maximum and the plane offset of its first one."""
        b = self.b

        def init(b, ox):
            self.store(self.fc(float("-inf")), self.best, ox)
            b.store(
                b.trunc(self.tap0_offset(oy, ox), I32),
                b.gep(self.idx, [ox], inbounds=True, source_etype=I32),
            )

        counted_loop(b, i64(0), i64(self.ow), init, "init")

        def visit(b, off, ox):
            v, best = self.load(x, off), self.load(self.best, ox)
            take = self.takes(v, best)
            self.store(b.select(take, v, best), self.best, ox)
            p = b.gep(self.idx, [ox], inbounds=True, source_etype=I32)
            b.store(b.select(take, b.trunc(off, I32), b.load(p, typ=I32)), p)

        self.sweep_taps(oy, visit)

    def argmax_at(self, ox):
        b = self.b
        return b.sext(b.load(b.gep(self.idx, [ox], inbounds=True, source_etype=I32), typ=I32), I64)

    def unrolled(self) -> bool:
        """Whether windows are computed whole, taps unrolled: no padding (every tap is real) and
        few taps. One loop over ox then reads each window once, keeps its maximum in registers
        and writes every position of a backward window in the same iteration."""
        return not any(self.spec.padding) and self.kh * self.kw <= UNROLLED_TAPS

    def write_windows(self, oy, dx, value, window_values=None):
        """Non-overlapping windows: dx at every input position of row oy's windows =
        value(b, off, ox), or where windows are unrolled and `window_values` is given, the
        windows' values window_values(b, win) in tap order (win: pool_windows.Windows); then
        the rows below them, up to the next windows' rows, zeroed."""
        b, zero = self.b, self.fc(0.0)
        start = b.sub(b.mul(oy, i64(self.sh)), i64(self.pt))

        def zero_row(b, iy):
            self.fill(dx, b.mul(iy, i64(self.w)), b.mul(b.add(iy, i64(1)), i64(self.w)), zero)

        row_start = None if self.spec.columns_covered else zero_row
        if self.unrolled() and window_values is not None:
            for i in range(self.kh if row_start else 0):
                zero_row(b, b.add(start, i64(i)))
            window_row(self, oy, lambda b, win: win.store_taps(dx, window_values(b, win)))
        else:
            self.sweep_taps(
                oy, lambda b, off, ox: self.store(value(b, off, ox), dx, off), row_start
            )
        lo = self.imin(self.imax(b.add(start, i64(self.kh)), i64(0)), i64(self.h))
        nxt = self.imin(self.imax(b.add(start, i64(self.sh)), i64(0)), i64(self.h))
        hi = b.select(b.icmp_signed("==", oy, i64(self.oh - 1)), i64(self.h), nxt)
        self.fill(
            dx,
            b.mul(lo, i64(self.w)),
            self.imax(b.mul(hi, i64(self.w)), b.mul(lo, i64(self.w))),
            zero,
        )

    def emit(self, p):
        b, s = self.b, self.spec
        out_n, in_n = s.plane_sizes()
        out = self.ptr(self.out, b.mul(p, i64(out_n)))
        ins = [self.ptr(a, b.mul(p, i64(n))) for a, n in zip(self.ins, in_n)]
        ow, zero = i64(self.ow), self.fc(0.0)
        k = self.fc(float(self.kh * self.kw))
        if s.writes_input_plane and s.overlapping:
            self.fill(out, i64(0), i64(out_n), zero)
        op, unrolled = s.op, self.unrolled()

        def row(b, oy):
            y0 = b.mul(oy, ow)
            yrow = self.ptr(out, y0)
            if op == "maxPool2d" and unrolled:
                window_row(
                    self,
                    oy,
                    lambda b, win: win.store_out(yrow, first_max(self, win.taps(ins[0]))[0]),
                )
            elif op == "maxPool2d":
                self.fill(yrow, i64(0), ow, self.fc(float("-inf")))

                def visit(b, off, ox):
                    v, best = self.load(ins[0], off), self.load(yrow, ox)
                    self.store(b.select(self.takes(v, best), v, best), yrow, ox)

                self.sweep_taps(oy, visit)
            elif op == "avgPool2d" and unrolled:

                def mean(b, win):
                    vals = win.taps(ins[0])
                    total = vals[0]
                    for v in vals[1:]:  # in tap order, as numpy's sum over the window axis
                        total = self.e.fadd(total, v)
                    win.store_out(
                        yrow, self.e.fdiv(total, splat(self.T, float(self.kh * self.kw), total))
                    )

                window_row(self, oy, mean)
            elif op == "avgPool2d":
                self.fill(yrow, i64(0), ow, self.fc(-0.0))  # -0.0: x + -0.0 == x for every x
                self.sweep_taps(
                    oy,
                    lambda b, off, ox: self.store(
                        self.e.fadd(self.load(yrow, ox), self.load(ins[0], off)), yrow, ox
                    ),
                )
                counted_loop(
                    b,
                    i64(0),
                    ow,
                    lambda b, ox: self.store(self.e.fdiv(self.load(yrow, ox), k), yrow, ox),
                    "mean",
                )
            elif op == "maxPool2dGather" and unrolled:
                window_row(
                    self,
                    oy,
                    lambda b, win: win.store_out(
                        yrow, pick(self, first_max(self, win.taps(ins[0]))[1], win.taps(ins[1]))
                    ),
                )
            elif op == "maxPool2dGather":
                self.argmax_row(ins[0], oy)

                def gather(b, ox):
                    at = self.argmax_at(ox)
                    v = self.load(ins[1], self.imax(at, i64(0)))  # never reads before the plane
                    self.store(b.select(b.icmp_signed(">=", at, i64(0)), v, zero), yrow, ox)

                counted_loop(b, i64(0), ow, gather, "gather")
            elif op == "maxPool2dBackward" and not s.overlapping:
                dyrow = self.ptr(ins[1], y0)

                def routed(b, win):  # dY at the window's first maximum, 0 elsewhere
                    at, g = first_max(self, win.taps(ins[0]))[1], win.at_out(dyrow)
                    return [
                        b.select(b.icmp_signed("==", at, splat(I32, t, at)), g, win.zero(g))
                        for t in range(self.kh * self.kw)
                    ]

                if not unrolled:
                    self.argmax_row(ins[0], oy)
                self.write_windows(
                    oy,
                    out,
                    lambda b, off, ox: b.select(
                        b.icmp_signed("==", self.argmax_at(ox), off), self.load(dyrow, ox), zero
                    ),
                    routed,
                )
            elif op == "maxPool2dBackward":
                self.argmax_row(ins[0], oy)
                dyrow = self.ptr(ins[1], y0)

                def route(b, ox):
                    at = self.argmax_at(ox)
                    with b.if_then(b.icmp_signed(">=", at, i64(0))):
                        self.store(self.e.fadd(self.load(out, at), self.load(dyrow, ox)), out, at)

                counted_loop(b, i64(0), ow, route, "route")
            else:
                assert op == "avgPool2dBackward", op
                dyrow = self.ptr(ins[0], y0)
                if not s.overlapping:

                    def shared(b, win):
                        g = win.at_out(dyrow)
                        return [self.e.fdiv(g, splat(self.T, float(self.kh * self.kw), g))] * (
                            self.kh * self.kw
                        )

                    self.write_windows(
                        oy, out, lambda b, off, ox: self.e.fdiv(self.load(dyrow, ox), k), shared
                    )
                else:
                    counted_loop(
                        b,
                        i64(0),
                        ow,
                        lambda b, ox: self.store(
                            self.e.fdiv(self.load(dyrow, ox), k), self.share, ox
                        ),
                        "share",
                    )
                    self.sweep_taps(
                        oy,
                        lambda b, off, ox: self.store(
                            self.e.fadd(self.load(out, off), self.load(self.share, ox)), out, off
                        ),
                    )

        counted_loop(b, i64(0), i64(self.oh), row, "oy")


def _build(spec: PoolSpec, symbol: str, triple: str, datalayout: str) -> str:
    module = ir.Module(name="dlvm_eq")
    module.triple, module.data_layout = triple, datalayout
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64, I64, PTR, PTR, PTR]), symbol)
    mark_noalias(fn, 2)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    p0, p1, out, a, c = fn.args
    n_in = len(spec.plane_sizes()[1])
    plane = _Plane(b, spec, out, [a, c][:n_in])
    counted_loop(b, p0, p1, lambda b, p: plane.emit(p), "plane")
    b.ret_void()
    return str(module)


def pool_ir(spec: PoolSpec) -> CpuIR:
    """LLVM IR text for the host; the symbol hashes the IR (equal kernels coincide)."""
    tm = target_machine()
    text, symbol = symbol_for(lambda sym: _build(spec, sym, tm.triple, str(tm.target_data)))
    return CpuIR(text, symbol, None, "pool")
