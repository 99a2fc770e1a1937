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
# Head dims up to this are unrolled (AttentionKernel.each): a thread's q row and output
# accumulator then live in registers (ptxas -v, sm_80, head dim 64: the forward's local-memory
# stack frame went from 640 to 128 bytes, the scores of a tile).
UNROLL = 128

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
    # "forward"; the backward's "dq" (dQ and D = rowsum(dO * O), per query row, as the
    # forward) and "dkv" (dK and dV, a CTA per key block, query tiles in shared memory):
    # attention_backward_ptx.py
    kernel: str = "forward"

    @property
    def batches(self) -> int:
        return self.batch[0] * self.batch[1]

    def rows(self) -> int:
        """Rows the CTAs own, one a thread: queries, or keys for "dkv"."""
        return self.n if self.kernel == "dkv" else self.m

    def row_blocks(self) -> int:
        return -(-self.rows() // self.query_block)

    def grid(self) -> int:
        """CTAs of a launch."""
        return self.batches * self.row_blocks()

    def tile_width(self) -> int:
        """Elements of one tile row in shared memory: a key's k and v, or for "dkv" a query's
        q and dO, its log-sum-exp and D."""
        return self.d + self.e + (2 if self.kernel == "dkv" else 0)

    def tile_rows(self) -> int:
        """Rows of a shared-memory tile: key_block, halved until it fits SHARED_BYTES."""
        rows, size = self.key_block, self.tile_width() * (4 if self.dtype == "f32" else 8)
        while rows > 1 and rows * size > SHARED_BYTES:
            rows //= 2
        return rows

    def shared_elements(self) -> int:
        return self.tile_rows() * self.tile_width()


class AttentionKernel:
    """A kernel's body on one builder (GPU or host emulation): `pointers` global arrays, one
    shared-memory tile, barriers; emit() writes the body (the subclasses)."""

    pointers = 6

    def __init__(self, module: ir.Module, spec: AttentionGpuSpec, symbol: str):
        self.spec, self.host = spec, module.host_emulation
        T = self.T = F32 if spec.dtype == "f32" else F64
        ptr = ir.PointerType() if self.host else GLOBAL
        # host emulation: the CTA's shared buffer and a barrier callback, then the registers
        callback = ir.PointerType(ir.FunctionType(ir.VoidType(), []))  # `call` reads its type
        extra = [ir.PointerType(), callback] + [I32] * len(SREGS) if self.host else []
        n = self.pointers
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr] * n + extra), symbol)
        if not self.host:
            fn.calling_convention = "ptx_kernel"
        for a in fn.args[:n]:
            a.add_attribute("noalias")
        self.fn = fn
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.e = Emitter(self.b)
        self.bk = spec.tile_rows()
        size = spec.shared_elements()
        if self.host:
            self.shared = fn.args[n]
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
            b.call(self.fn.args[self.pointers + 1], [])
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

    def each(self, width: int, body, name: str) -> None:
        """body(b, i) for i < width (a head dim): unrolled up to UNROLL, so that a thread's rows
        are indexed by constants and LLVM keeps them in registers, not local memory."""
        if width > UNROLL:
            counted_loop(self.b, self.c(0), self.c(width), body, name)
            return
        for i in range(width):
            body(self.b, self.c(i))

    def dot(self, a, a_at, x, x_at, width: int):
        """sum over i < width of a[a_at + i] * x[x_at + i]."""
        b, e = self.b, self.e
        acc = entry_alloca(b, self.T, "dot")
        b.store(self.f(0.0), acc)

        def step(b, i):
            term = e.fmul(self.load(a, b.add(a_at, i)), self.load(x, b.add(x_at, i)))
            b.store(e.fadd(b.load(acc, typ=self.T), term), acc)

        self.each(width, step, "dot")
        return b.load(acc, typ=self.T)

    def axpy(self, acc, alpha, x, x_at, width: int) -> None:
        """acc[i] += alpha * x[x_at + i] for i < width (acc: a thread's private array)."""
        e = self.e

        def step(b, i):
            self.store(
                e.fadd(self.load(acc, i), e.fmul(alpha, self.load(x, b.add(x_at, i)))), acc, i
            )

        self.each(width, step, "axpy")

    def fill(self, src, start, count, at: int) -> None:
        """shared[at + i] = src[start + i] for i < count, the CTA's threads striding."""
        b = self.b

        def one(b, i):
            self.store(self.load(src, b.add(start, i)), self.shared, b.add(self.c(at), i))

        counted_loop(b, self.sreg("tid.x"), count, one, "fill", step=self.sreg("ntid.x"))

    def owned_row(self):
        """(batch index, first row of the CTA's block, this thread's row, row < rows) for a
        CTA per (batch index, block of rows). Under causal the last query block and the first
        key block have the most work: those blocks go first, so none is left last."""
        b, c, s = self.b, self.c, self.spec
        blocks = s.row_blocks()
        cta = self.sreg("ctaid.x")
        bh, block = b.udiv(cta, c(blocks)), b.urem(cta, c(blocks))
        if s.kernel != "dkv":
            block = b.sub(c(blocks - 1), block)
        r0 = b.mul(block, c(s.query_block))
        row = b.add(r0, self.sreg("tid.x"))
        return bh, r0, row, b.icmp_unsigned("<", row, c(s.rows()))

    def score(self, dot, bias, bias_row, query, key):
        """dot + bias[query, key] (bias_row: the offset of bias[b1, b2, query, 0]), -inf where
        causal hides the key from the query."""
        b = self.b
        at = b.add(bias_row, b.mul(key, self.c(self.spec.bias_strides[3])))
        x = self.e.fadd(dot, self.load(bias, at))
        if self.spec.causal:
            x = b.select(b.icmp_unsigned(">", key, query), self.f(-math.inf), x)
        return x

    def bias_row(self, bh, query):
        """The offset of bias[b1, b2, query, 0] of batch index bh."""
        b, c, st = self.b, self.c, self.spec.bias_strides
        b1, b2 = b.udiv(bh, c(self.spec.batch[1])), b.urem(bh, c(self.spec.batch[1]))
        return b.add(b.add(b.mul(b1, c(st[0])), b.mul(b2, c(st[1]))), b.mul(query, c(st[2])))

    def emit(self) -> None:
        raise NotImplementedError


class ForwardKernel(AttentionKernel):
    """out and lse from q, k, v, bias: a thread per query row, k and v tiles shared."""

    def emit(self) -> None:
        s, b, e, c = self.spec, self.b, self.e, self.c
        out, lse, q, k, v, bias = self.fn.args[:6]
        d, ev, n, m = s.d, s.e, s.n, s.m
        bh, q0, row, valid = self.owned_row()
        q_end = b.select(
            b.icmp_unsigned("<", b.add(q0, c(s.query_block)), c(m)),
            b.add(q0, c(s.query_block)),
            c(m),
        )
        # keys past the block's last query are all hidden under causal: not visited
        k_end = b.select(b.icmp_unsigned("<", q_end, c(n)), q_end, c(n)) if s.causal else c(n)
        qrow, acc, sc = (
            self.private(size, name) for size, name in ((d, "q"), (ev, "acc"), (self.bk, "s"))
        )
        self.run_max, self.run_sum = entry_alloca(b, self.T, "max"), entry_alloca(b, self.T, "sum")
        b.store(self.f(-math.inf), self.run_max)
        b.store(self.f(0.0), self.run_sum)
        bias_row = self.bias_row(bh, row)
        q_at = b.mul(b.add(b.mul(bh, c(m)), row), c(d))
        with b.if_then(valid):  # q scaled once per row: d, not n, products
            self.each(d, lambda b, j: self.store(
                    e.fmul(self.load(q, b.add(q_at, j)), self.f(s.scale)), qrow, j
                ), "q"
            )  # fmt: skip
            self.each(ev, lambda b, j: self.store(self.f(0.0), acc, j), "zero")

        def tile(b, k0):
            kt = b.sub(k_end, k0)
            kt = b.select(b.icmp_signed("<", kt, c(self.bk)), kt, c(self.bk))
            self.barrier()  # every thread is done with the previous tile
            self.fill(k, b.mul(b.add(b.mul(bh, c(n)), k0), c(d)), b.mul(kt, c(d)), 0)
            self.fill(v, b.mul(b.add(b.mul(bh, c(n)), k0), c(ev)), b.mul(kt, c(ev)), self.bk * d)
            self.barrier()  # the tile is in shared memory
            with b.if_then(valid):
                self.row_tile(k0, kt, row, bias, bias_row, qrow, acc, sc)

        counted_loop(b, c(0), k_end, tile, "tile", step=c(self.bk))
        with b.if_then(valid):
            total = b.load(self.run_sum, typ=self.T)
            o_at = b.mul(b.add(b.mul(bh, c(m)), row), c(ev))
            self.each(ev, lambda b, j: self.store(
                    e.fdiv(self.load(acc, j), total), out, b.add(o_at, j)
                ), "out"
            )  # fmt: skip
            top = b.load(self.run_max, typ=self.T)
            self.store(e.fadd(top, log(e, total)), lse, b.add(b.mul(bh, c(m)), row))
        b.ret_void()

    def row_tile(self, k0, kt, row, bias, bias_row, qrow, acc, sc):
        """One thread's row against the tile in shared memory: its scores, the new running max,
        the rescale of the sum and output, and the tile's weights times v."""
        s, b, e, c = self.spec, self.b, self.e, self.c
        d, ev, bk = s.d, s.e, self.bk
        tmax = entry_alloca(b, self.T, "tile_max")
        b.store(self.f(-math.inf), tmax)

        def score(b, j):
            x = self.score(
                self.dot(qrow, c(0), self.shared, b.mul(j, c(d)), d),
                bias,
                bias_row,
                row,
                b.add(k0, j),
            )
            self.store(x, sc, j)
            old = b.load(tmax, typ=self.T)
            b.store(e.select(e.fcmp("u>", x, old), x, old), tmax)

        counted_loop(b, c(0), kt, score, "score")
        old_max = b.load(self.run_max, typ=self.T)
        new_max = b.load(tmax, typ=self.T)
        new_max = e.select(e.fcmp("u>", new_max, old_max), new_max, old_max)
        # a row that has seen only hidden keys keeps a finite shift: its weights are 0, not NaN
        shift = e.select(e.fcmp("==", new_max, self.f(-math.inf)), self.f(0.0), new_max)
        rescale = exp(e, e.fsub(old_max, shift))  # exp(old max - new max); 0 before any key
        b.store(new_max, self.run_max)
        b.store(e.fmul(b.load(self.run_sum, typ=self.T), rescale), self.run_sum)
        self.each(
            ev, lambda b, i: self.store(e.fmul(self.load(acc, i), rescale), acc, i), "rescale"
        )

        def weigh(b, j):
            p = exp(e, e.fsub(self.load(sc, j), shift))
            b.store(e.fadd(b.load(self.run_sum, typ=self.T), p), self.run_sum)
            self.axpy(acc, p, self.shared, b.add(c(bk * d), b.mul(j, c(ev))), ev)

        counted_loop(b, c(0), kt, weigh, "weigh")


def _module(spec: AttentionGpuSpec, symbol: str, arch: str, host_emulation: bool) -> str:
    module = new_module(arch, host_emulation)
    if spec.kernel == "forward":
        ForwardKernel(module, spec, symbol).emit()
    else:  # late: the backward's builders extend this module's
        from .attention_backward_ptx import BACKWARD_KERNELS

        BACKWARD_KERNELS[spec.kernel](module, spec, symbol).emit()
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
