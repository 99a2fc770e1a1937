"""The fused `attention` op (ir/attention_op.py) as one PTX kernel: FlashAttention-2's forward,
online softmax over key tiles, the score matrix never written (the CPU's is
cpu/attention_ir.py). Through llvm_ptx's NVPTX path, like pool_ptx.py.

ABI: one CTA per (batch index, query block), a 1-D grid of batch * query blocks CTAs of
`query_block` threads, static shared memory only,
    .entry k(ptr.global out, ptr.global lse, ptr.global q, ptr.global k, ptr.global v,
             ptr.global bias)
q, k, v, out: C-contiguous (batch, m, d), (batch, n, d), (batch, n, e), (batch, m, e); lse
(batch, m): each score row's log-sum-exp (natural log; -inf for a row whose every key is
hidden), what the backward reads. bias: any array whose broadcast to the scores' shape
(B1, B2, m, n) has the element strides `spec.bias_strides` (0 where it broadcasts; a scalar
bias is a one-element array with strides 0).

Thread t of a CTA owns query row q0 + t: its scaled q row, its running max, sum and unnormalized
output stay in the thread; each key tile (k and v rows) is loaded once into shared memory by the
whole CTA and read by every thread (the same address across a warp: a broadcast, no bank
conflicts). The output is divided by the sum once, at the end (FlashAttention-2's deferred
normalization). Semantics are the CPU kernel's (runtime/attention_cpu.py): causal hides key j
from query i where j > i (top-left aligned; tiles past a block's last query are not visited),
a row that has seen only hidden keys keeps a shift of 0 so its weights are 0, and a row whose
every key is hidden gives NaN (0/0), as the naive formula does.

    >>> text, symbol = attention_ptx_ir(spec, "sm_80")
    >>> ptx = compile_ptx(text, "sm_80")
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from ..llvm.emitter import F32, F64, I32, I64, Emitter
from ..llvm.loops import counted_loop, entry_alloca
from ..llvm.polymath import exp, log
from ..llvm.symbols import symbol_for
from .llvm_ptx import GLOBAL, SREGS, new_module

# One query row per thread and 64 rows a CTA: two warps, so a CTA's barrier waits on few
# threads, and at seq 1024 a head already has 16 CTAs. Not calibrated: no device was lent
# when this was written (scripts/gpu-check times the kernel where one is).
QUERY_BLOCK = 64
# Keys per shared-memory tile: 32 keys of head dim 64 for k and v are 16 KiB in float32, so
# three CTAs fit the 48 KiB of static shared memory every arch from sm_75 on gives; the tile
# shrinks for wider heads (tile_keys) to stay within SHARED_BYTES.
KEY_BLOCK = 32
SHARED_BYTES = 16 * 1024

_PLACEHOLDER = "__dq_attention__"


@dataclass(frozen=True)
class AttentionGpuSpec:
    """One attention launch's compile-time shape: batch (B1, B2) (leading dims folded to two),
    m queries, n keys, head dims d (q, k) and e (v); scale, causal mode, the bias's element
    strides over (B1, B2, m, n), dtype ("f32" or "f64") and the tiles."""

    dtype: str
    batch: tuple[int, int]
    m: int
    n: int
    d: int
    e: int
    scale: float
    causal: bool
    bias_strides: tuple[int, int, int, int]
    query_block: int = QUERY_BLOCK
    key_block: int = KEY_BLOCK

    @property
    def batches(self) -> int:
        return self.batch[0] * self.batch[1]

    def query_blocks(self) -> int:
        return -(-self.m // self.query_block)

    def grid(self) -> int:
        """CTAs of a launch."""
        return self.batches * self.query_blocks()


def tile_keys(d: int, e: int, itemsize: int, key_block: int = KEY_BLOCK) -> int:
    """Keys per tile: key_block, halved until the tile's k and v rows fit SHARED_BYTES."""
    keys = key_block
    while keys > 1 and keys * (d + e) * itemsize > SHARED_BYTES:
        keys //= 2
    return keys


class _Kernel:
    """The kernel's body on one builder (GPU or host emulation)."""

    def __init__(self, module: ir.Module, spec: AttentionGpuSpec, symbol: str):
        self.spec, self.host = spec, module.host_emulation
        T = self.T = F32 if spec.dtype == "f32" else F64
        ptr = ir.PointerType() if self.host else GLOBAL
        # host emulation: the CTA's shared buffer and a barrier callback, then the registers
        callback = ir.PointerType(ir.FunctionType(ir.VoidType(), []))  # `call` reads its type
        extra = [ir.PointerType(), callback] + [I32] * len(SREGS) if self.host else []
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr] * 6 + extra), symbol)
        if not self.host:
            fn.calling_convention = "ptx_kernel"
        for a in fn.args[:6]:
            a.add_attribute("noalias")
        self.fn = fn
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.e = Emitter(self.b)
        self.bk = tile_keys(spec.d, spec.e, 4 if spec.dtype == "f32" else 8, spec.key_block)
        size = self.bk * (spec.d + spec.e)
        if self.host:
            self.shared = fn.args[6]
        else:
            arr = ir.ArrayType(T, size)
            g = ir.GlobalVariable(module, arr, "dq_attention_tile", addrspace=3)
            g.type = ir.PointerType(addrspace=3)  # opaque, as every other pointer here
            g.linkage, g.initializer, g.align = "internal", ir.Constant(arr, ir.Undefined), 16
            self.shared = g

    def c(self, v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def f(self, v: float) -> ir.Constant:
        return ir.Constant(self.T, v)

    def sreg(self, name: str):
        b = self.b
        if self.host:
            v = self.fn.args[len(self.fn.args) - len(SREGS) + SREGS.index(name)]
        else:
            fname = f"llvm.nvvm.read.ptx.sreg.{name}"
            fn = b.module.globals.get(fname) or ir.Function(
                b.module, ir.FunctionType(I32, []), fname
            )
            v = b.call(fn, [])
        return b.zext(v, I64)

    def barrier(self) -> None:
        b = self.b
        if self.host:  # the emulator's callback: waits for the CTA's other threads
            b.call(self.fn.args[7], [])
            return
        fn = b.module.globals.get("llvm.nvvm.barrier0") or ir.Function(
            b.module, ir.FunctionType(ir.VoidType(), []), "llvm.nvvm.barrier0"
        )
        b.call(fn, [])

    def private(self, size: int, name: str):
        """A thread's array of `size` elements (registers once LLVM unrolls its loops)."""
        a = entry_alloca(self.b, ir.ArrayType(self.T, max(size, 1)), name)
        a.type = ir.PointerType()  # opaque, as every other pointer here (llvmlite types it)
        return a

    def at(self, base, idx):
        return self.b.gep(base, [idx], inbounds=True, source_etype=self.T)

    def load(self, base, idx):
        return self.b.load(self.at(base, idx), typ=self.T)

    def store(self, v, base, idx) -> None:
        self.b.store(v, self.at(base, idx))

    def emit(self) -> None:
        s, b, e, c = self.spec, self.b, self.e, self.c
        out, lse, q, k, v, bias = self.fn.args[:6]
        d, ev, n, m, bk = s.d, s.e, s.n, s.m, self.bk
        qbs = s.query_blocks()
        cta, tid, ntid = self.sreg("ctaid.x"), self.sreg("tid.x"), self.sreg("ntid.x")
        bh = b.udiv(cta, c(qbs))
        # the last query block first: under causal it has the most keys, so none is left last
        qb = b.sub(c(qbs - 1), b.urem(cta, c(qbs)))
        q0 = b.mul(qb, c(s.query_block))
        row = b.add(q0, tid)
        valid = b.icmp_unsigned("<", row, c(m))
        q_end = b.select(
            b.icmp_unsigned("<", b.add(q0, c(s.query_block)), c(m)),
            b.add(q0, c(s.query_block)),
            c(m),
        )
        k_end = b.select(b.icmp_unsigned("<", q_end, c(n)), q_end, c(n)) if s.causal else c(n)
        kv_k, kv_v = b.mul(bh, c(n * d)), b.mul(bh, c(n * ev))
        qrow, acc, sc = (
            self.private(size, name) for size, name in ((d, "q"), (ev, "acc"), (bk, "s"))
        )
        run_max, run_sum = entry_alloca(b, self.T, "max"), entry_alloca(b, self.T, "sum")
        tmax = entry_alloca(b, self.T, "tile_max")
        b.store(self.f(-math.inf), run_max)
        b.store(self.f(0.0), run_sum)
        b1, b2 = b.udiv(bh, c(s.batch[1])), b.urem(bh, c(s.batch[1]))
        st = s.bias_strides
        bias_row = b.add(b.add(b.mul(b1, c(st[0])), b.mul(b2, c(st[1]))), b.mul(row, c(st[2])))
        q_at = b.mul(b.add(b.mul(bh, c(m)), row), c(d))
        scale = self.f(s.scale)

        with b.if_then(valid):
            counted_loop(
                b, c(0), c(d), lambda b, j: self.store(
                    e.fmul(self.load(q, b.add(q_at, j)), scale), qrow, j
                ), "q"
            )  # fmt: skip
            counted_loop(b, c(0), c(ev), lambda b, j: self.store(self.f(0.0), acc, j), "zero")

        def tile(b, k0):
            kt = b.sub(k_end, k0)
            kt = b.select(b.icmp_signed("<", kt, c(bk)), kt, c(bk))
            self.barrier()  # every thread is done with the previous tile

            def fill(src, base, width, off):
                def one(b, i):
                    self.store(self.load(src, b.add(base, b.add(b.mul(k0, c(width)), i))),
                               self.shared, b.add(c(off), i))  # fmt: skip

                counted_loop(b, tid, b.mul(kt, c(width)), one, "fill", step=ntid)

            fill(k, kv_k, d, 0)
            fill(v, kv_v, ev, bk * d)
            self.barrier()  # the tile is in shared memory
            with b.if_then(valid):
                self.row_tile(k0, kt, row, bias, bias_row, qrow, acc, sc, run_max, run_sum, tmax)

        counted_loop(b, c(0), k_end, tile, "tile", step=c(bk))
        with b.if_then(valid):
            total = b.load(run_sum, typ=self.T)
            o_at = b.mul(b.add(b.mul(bh, c(m)), row), c(ev))
            counted_loop(
                b, c(0), c(ev), lambda b, j: self.store(
                    e.fdiv(self.load(acc, j), total), out, b.add(o_at, j)
                ), "out"
            )  # fmt: skip
            top = b.load(run_max, typ=self.T)
            self.store(e.fadd(top, log(e, total)), lse, b.add(b.mul(bh, c(m)), row))
        b.ret_void()

    def row_tile(self, k0, kt, row, bias, bias_row, qrow, acc, sc, run_max, run_sum, tmax):
        """One thread's row against the tile in shared memory: its scores, the new running max,
        the rescale of the sum and output, and the tile's weights times v."""
        s, b, e, c = self.spec, self.b, self.e, self.c
        d, ev, bk = s.d, s.e, self.bk
        b.store(self.f(-math.inf), tmax)
        dot = entry_alloca(b, self.T, "dot")

        def score(b, j):
            b.store(self.f(0.0), dot)
            counted_loop(
                b, c(0), c(d), lambda b, i: b.store(e.fadd(b.load(dot, typ=self.T), e.fmul(
                    self.load(qrow, i), self.load(self.shared, b.add(b.mul(j, c(d)), i))
                )), dot), "dot"
            )  # fmt: skip
            key = b.add(k0, j)
            x = e.fadd(
                b.load(dot, typ=self.T),
                self.load(bias, b.add(bias_row, b.mul(key, c(s.bias_strides[3])))),
            )
            if s.causal:
                x = b.select(b.icmp_unsigned(">", key, row), self.f(-math.inf), x)
            self.store(x, sc, j)
            old = b.load(tmax, typ=self.T)
            b.store(e.select(e.fcmp("u>", x, old), x, old), tmax)

        counted_loop(b, c(0), kt, score, "score")
        old_max = b.load(run_max, typ=self.T)
        new_max = b.load(tmax, typ=self.T)
        new_max = e.select(e.fcmp("u>", new_max, old_max), new_max, old_max)
        # a row that has seen only hidden keys keeps a finite shift: its weights are 0, not NaN
        shift = e.select(e.fcmp("==", new_max, self.f(-math.inf)), self.f(0.0), new_max)
        rescale = exp(e, e.fsub(old_max, shift))  # exp(old max - new max); 0 before any key
        b.store(new_max, run_max)
        b.store(e.fmul(b.load(run_sum, typ=self.T), rescale), run_sum)
        counted_loop(
            b,
            c(0),
            c(ev),
            lambda b, i: self.store(e.fmul(self.load(acc, i), rescale), acc, i),
            "rescale",
        )

        def weigh(b, j):
            p = exp(e, e.fsub(self.load(sc, j), shift))
            b.store(e.fadd(b.load(run_sum, typ=self.T), p), run_sum)
            counted_loop(
                b, c(0), c(ev), lambda b, i: self.store(e.fadd(self.load(acc, i), e.fmul(
                    p, self.load(self.shared, b.add(c(bk * d), b.add(b.mul(j, c(ev)), i)))
                )), acc, i), "pv"
            )  # fmt: skip

        counted_loop(b, c(0), kt, weigh, "weigh")


def _module(spec: AttentionGpuSpec, symbol: str, arch: str, host_emulation: bool) -> str:
    module = new_module(arch, host_emulation)
    _Kernel(module, spec, symbol).emit()
    return str(module)


def _named(spec: AttentionGpuSpec, prefix: str, arch: str, host: bool) -> tuple[str, str]:
    return symbol_for(lambda name: _module(spec, name, arch, host), prefix, _PLACEHOLDER)


def attention_ptx_ir(spec: AttentionGpuSpec, arch: str = "sm_75") -> tuple[str, str]:
    """(LLVM IR text for NVPTX, symbol); the symbol hashes the IR."""
    return _named(spec, "dq_attention_", arch, False)


def attention_host_emulation_ir(spec: AttentionGpuSpec) -> tuple[str, str]:
    """The kernel's IR for the host: after the six pointers, the CTA's shared buffer
    (tile_keys * (d + e) elements), a `void()` barrier callback, and the special registers as
    six i32 (llvm_ptx.SREGS). Tests run each CTA's threads on host threads this way
    (tests/fake_cupy.py), the callback a barrier across them."""
    return _named(spec, "dq_gpu_attention_", "sm_75", True)
