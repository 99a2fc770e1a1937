"""A PoolSpec as PTX (the CPU version is cpu/pool_ir.py), through llvm_ptx's NVPTX path.

ABI: a grid-stride loop over items,
    .entry k(i64 n, ptr.global out, ptr.global in_0, ptr.global in_1)
Forward ops and the gather: one item per output (plane, oy, ox), reading its window's taps in
row-major order. Backward ops: one item per input position (plane, iy, ix), looping over the
windows that cover it (windows in (oy, ox) order, the CPU's order), each max window's first
maximum recomputed: every position is written by its own thread once, so no atomics and no
zero fill are needed. in_1 is ignored by one-operand ops.

    >>> text, symbol = pool_ptx_ir(spec, "sm_90")
    >>> ptx = compile_ptx(text, "sm_90")
"""

from __future__ import annotations

from llvmlite import ir

from ..cpu.pool_ir import PoolEmitter
from ..kernels.pool_spec import PoolSpec
from ..llvm.emitter import I64
from ..llvm.loops import counted_loop, entry_alloca
from ..llvm.symbols import symbol_for
from .llvm_ptx import grid_stride, kernel_function, new_module

_PLACEHOLDER = "__dq_pool__"


class _Item(PoolEmitter):
    """One thread's item: a window (forward) or an input position (backward)."""

    def window_max(self, x, oy, ox):
        """(maximum, plane offset of its first occurrence or -1 for a padded tap) of window
        (oy, ox), taps in row-major order."""
        b = self.b
        best = entry_alloca(b, self.T, "best")
        at = entry_alloca(b, I64, "at")
        b.store(self.fc(float("-inf")), best)
        b.store(self.tap0_offset(oy, ox), at)

        def visit(b, off):
            v, cur = self.load(x, off), b.load(best, typ=self.T)
            take = self.takes(v, cur)
            b.store(b.select(take, v, cur), best)
            b.store(b.select(take, off, b.load(at, typ=I64)), at)

        self.sweep_window(oy, ox, visit)
        return b.load(best, typ=self.T), b.load(at, typ=I64)

    def window_sum(self, x, oy, ox):
        b = self.b
        acc = entry_alloca(b, self.T, "sum")
        b.store(self.fc(-0.0), acc)  # -0.0: x + -0.0 == x for every x

        def visit(b, off):
            b.store(self.e.fadd(b.load(acc, typ=self.T), self.load(x, off)), acc)

        self.sweep_window(oy, ox, visit)
        return b.load(acc, typ=self.T)

    def sweep_window(self, oy, ox, visit):
        """visit(b, off) for each real tap of window (oy, ox), in row-major order."""
        b = self.b

        def tap_row(b, i):
            iy = b.sub(b.add(b.mul(oy, self.c(self.sh)), i), self.c(self.pt))

            def tap_col(b, j):
                ix = b.sub(b.add(b.mul(ox, self.c(self.sw)), j), self.c(self.pl))
                with b.if_then(b.and_(self.between(iy, 0, self.h), self.between(ix, 0, self.w))):
                    visit(b, b.add(b.mul(iy, self.c(self.w)), ix))

            counted_loop(b, self.c(0), self.c(self.kw), tap_col, "tapx")

        counted_loop(b, self.c(0), self.c(self.kh), tap_row, "tapy")

    def covering(self, pos, pad, k, s, n_out):
        """[lo, hi) of the outputs along one axis whose windows cover input index pos."""
        b = self.b
        first = b.add(pos, self.c(pad - k + 1))  # o * s >= pos + pad - k + 1, o * s <= pos + pad
        lo = b.select(
            b.icmp_signed(">", first, self.c(0)),
            b.udiv(b.add(first, self.c(s - 1)), self.c(s)),
            self.c(0),
        )
        hi = self.imin(b.add(b.udiv(b.add(pos, self.c(pad)), self.c(s)), self.c(1)), self.c(n_out))
        return lo, hi

    def emit(self, i, out, ins):
        b, s, op = self.b, self.spec, self.spec.op
        out_n, in_n = s.plane_sizes()
        p, r = b.udiv(i, self.c(out_n)), b.urem(i, self.c(out_n))
        planes = [self.ptr(a, b.mul(p, self.c(n))) for a, n in zip(ins, in_n)]
        k = self.fc(float(self.kh * self.kw))
        if not s.writes_input_plane:
            oy, ox = b.udiv(r, self.c(self.ow)), b.urem(r, self.c(self.ow))
            if op == "avgPool2d":
                v = self.e.fdiv(self.window_sum(planes[0], oy, ox), k)
            else:
                best, at = self.window_max(planes[0], oy, ox)
                if op == "maxPool2d":
                    v = best
                else:  # the gather: g at the first maximum, 0 for a padded tap
                    g = self.load(planes[1], self.imax(at, self.c(0)))
                    v = b.select(b.icmp_signed(">=", at, self.c(0)), g, self.fc(0.0))
            self.store(v, out, i)
            return
        iy, ix = b.udiv(r, self.c(self.w)), b.urem(r, self.c(self.w))
        dy = planes[-1]
        acc = entry_alloca(b, self.T, "acc")
        b.store(self.fc(0.0), acc)
        oy_lo, oy_hi = self.covering(iy, self.pt, self.kh, self.sh, self.oh)
        ox_lo, ox_hi = self.covering(ix, self.pl, self.kw, self.sw, self.ow)

        def per_oy(b, oy):
            def per_ox(b, ox):
                g = self.load(dy, b.add(b.mul(oy, self.c(self.ow)), ox))
                if op == "avgPool2dBackward":
                    b.store(self.e.fadd(b.load(acc, typ=self.T), self.e.fdiv(g, k)), acc)
                    return
                at = self.window_max(planes[0], oy, ox)[1]
                with b.if_then(b.icmp_signed("==", at, r)):
                    b.store(self.e.fadd(b.load(acc, typ=self.T), g), acc)

            counted_loop(b, ox_lo, ox_hi, per_ox, "ox")

        counted_loop(b, oy_lo, oy_hi, per_oy, "oy")
        self.store(b.load(acc, typ=self.T), out, i)


def _module(spec: PoolSpec, symbol: str, arch: str, host_emulation: bool) -> str:
    module = new_module(arch, host_emulation)
    fn = kernel_function(module, symbol, 1, 3, 0, I64)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    n, out, a, c = fn.args[:4]
    item = _Item(b, spec, I64)
    ins = [a, c][: len(spec.plane_sizes()[1])]
    grid_stride(b, n, lambda b, i: item.emit(i, out, ins))
    b.ret_void()
    return str(module)


def _named(spec: PoolSpec, prefix: str, arch: str, host_emulation: bool) -> tuple[str, str]:
    return symbol_for(lambda name: _module(spec, name, arch, host_emulation), prefix, _PLACEHOLDER)


def pool_ptx_ir(spec: PoolSpec, arch: str = "sm_75") -> tuple[str, str]:
    """(LLVM IR text for NVPTX, symbol); the symbol hashes the IR."""
    return _named(spec, "dq_pool_", arch, False)


def pool_host_emulation_ir(spec: PoolSpec) -> tuple[str, str]:
    """The GPU kernel's IR for the host, special registers as six trailing i32 arguments
    (llvm_ptx.host_emulation_ir): tests run the GPU code on the CPU this way."""
    return _named(spec, "dq_gpu_pool_", "sm_75", True)


def items(spec: PoolSpec, planes: int) -> int:
    """Threads' items of a launch over `planes` planes (outputs, or input positions backward)."""
    return planes * spec.plane_sizes()[0]
