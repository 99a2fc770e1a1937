"""Our own float32 GEMM for the host CPU, in LLVM IR: C[m0:m1, n0:n1] (+)= A @ B, blocked and
packed like BLIS/GotoBLAS, with a register-tiled micro-kernel of MR x NR accumulators (NR =
one or more vectors), and an optional elementwise epilogue applied to each tile of C once it is
final (bias, activation, ...), so that the work after a matmul costs no pass of its own.

ABI (one call computes one block of C; threads take disjoint blocks):
    void gemm(i64 m0, i64 m1, i64 n0, i64 n1, i64 K,
              ptr A, i64 rsA, i64 csA, ptr B, i64 rsB, i64 csB, ptr C, i64 ldc,
              ptr packA, ptr packB, i32 accumulate, ptr epilogue_out_0, ..., ptr epilogue_in_0, ...)
C's column stride is 1. A is read in one of two ways (`GemmSpec.a_order`):
  "rows"  A's column stride is 1: the micro-kernel broadcasts A's elements straight from its
          rows (no packing; MR row streams), csA is ignored;
  "cols"  A's row stride is 1 (a transposed operand such as X.T): blocks of A are packed into
          MR-row panels first (MR contiguous floats per k), rsA is ignored;
  "rows_packed"  A's column stride is 1, packed like "cols" (a transposing copy): for row
          strides whose MR rows share few L1 sets (e.g. 1024 floats: every row in one set,
          1024^3 ran at half speed unpacked), csA is ignored.
B is packed into NR-column panels (zero-padded at the right edge) for each KC-deep slice of
K: with vector copies where B's columns are contiguous (`b_order` "rows"), element by element
otherwise ("any": a transposed B such as W.T, small in practice). A call whose rows fit in
one micro-tile uses each element of B once and reads B in place instead (rows, whole panels).
packA needs MC*KC (+16) floats, packB KC*round_up(n1-n0, NR) floats (`GemmSpec.scratch`).

Why not only BLAS: numpy's OpenBLAS does the MLP step's 256x784x256 products at 230-270
GFLOP/s on this machine's two cores; this micro-kernel runs at ~160 GFLOP/s on one core
(measured), the epilogue removes the elementwise pass after a matmul, and OpenBLAS's threads
busy-wait for ~100 ms after each call, competing with our own workers (gemm_runtime).
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from .emitter import Emitter
from .kernel import KernelSpec, c_strides
from .loops import counted_loop, i64
from .lower_expr import from_storage, lower, storage_type, to_storage

F32 = ir.FloatType()
I1 = ir.IntType(1)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()
LANES = 16                       # float32 lanes of an AVX-512 vector
VEC = ir.VectorType(F32, LANES)
MASK = ir.VectorType(I1, LANES)
N_FIXED_ARGS = 16                # the GEMM's arguments before the epilogue's pointers


@dataclass(frozen=True)
class GemmSpec:
    a_order: str = "rows"        # "rows" (A's columns contiguous) or "cols" (A's rows contiguous)
    b_order: str = "rows"        # "rows" (B's columns contiguous) or "any" (any strides)
    mr: int = 12                 # micro-tile rows
    nr: int = 32                 # micro-tile columns (a multiple of LANES)
    kc: int = 256                # depth of a K slice (B's micro-panel KC x NR stays in L1)
    mc: int = 144                # rows of A per packed block (a multiple of mr)
    # An elementwise kernel over C's (M, N) space applied to each tile once its last K slice
    # is stored: its input `epilogue_c` is C itself (read back from L1); its outputs and other
    # inputs are extra pointer arguments after `accumulate` (outputs first, then inputs, the
    # C input included, in the kernel's order).
    epilogue: KernelSpec | None = None
    epilogue_c: int = 0

    def __post_init__(self):
        if self.a_order not in ("rows", "cols", "rows_packed"):
            raise ValueError(f"a_order must be 'rows', 'cols' or 'rows_packed', got {self.a_order!r}")
        if self.b_order not in ("rows", "any"):
            raise ValueError(f"b_order must be 'rows' or 'any', got {self.b_order!r}")
        if self.nr % LANES or self.mc % self.mr:
            raise ValueError("nr must be a multiple of 16 and mc a multiple of mr")
        e = self.epilogue
        if e is not None and (len(e.shape) != 2 or not 0 <= self.epilogue_c < len(e.inputs)
                              or e.input_dtypes[self.epilogue_c] != "f32"
                              or e.inputs[self.epilogue_c].strides not in (None, c_strides(e.shape))):
            raise ValueError("a GEMM epilogue is a 2-D map reading C (float32, contiguous)")

    def scratch(self, n: int) -> tuple[int, int]:
        """(packA, packB) sizes in floats for blocks n columns wide."""
        return self.mc * self.kc + LANES, self.kc * (-(-n // self.nr) * self.nr)


def _const(v: int) -> ir.Constant:
    return i64(v)


class _Builder:
    def __init__(self, spec: GemmSpec, symbol: str):
        self.spec = spec
        self.module = ir.Module(name="dq_gemm")
        self.fma = ir.Function(self.module, ir.FunctionType(VEC, [VEC, VEC, VEC]), "llvm.fma.v16f32")
        self.mload = ir.Function(self.module, ir.FunctionType(VEC, [PTR, I32, MASK, VEC]),
                                 "llvm.masked.load.v16f32.p0")
        self.mstore = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [VEC, PTR, I32, MASK]),
                                  "llvm.masked.store.v16f32.p0")
        epi = spec.epilogue
        n_extra = len(epi.outputs) + len(epi.inputs) if epi is not None else 0
        args = [I64] * 5 + [PTR, I64, I64, PTR, I64, I64, PTR, I64, PTR, PTR, I32] + [PTR] * n_extra
        self.fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), args), symbol)
        for i in (5, 8, 11, 13, 14):
            self.fn.args[i].add_attribute("noalias")
        self.epi = self.epilogue_function() if epi is not None else None
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))

    # ---------------------------------------------------------------- helpers
    def loop(self, start, end, step, body, name):
        """for (i = start; i < end; i += step) body(i)."""
        b = self.b
        pre = b.block
        head = b.append_basic_block(f"{name}.head")
        blk = b.append_basic_block(f"{name}.body")
        done = b.append_basic_block(f"{name}.end")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, name=name)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, end), blk, done)
        b.position_at_end(blk)
        body(i)
        i.add_incoming(b.add(i, step), b.block)
        b.branch(head)
        b.position_at_end(done)

    def at(self, base, idx):
        return self.b.gep(base, [idx], source_etype=F32)

    def lane_mask(self, valid):
        """<16 x i1>: lane l < valid."""
        b = self.b
        vt = ir.VectorType(I64, LANES)
        splat = b.insert_element(ir.Constant(vt, ir.Undefined), valid, I32(0))
        splat = b.shuffle_vector(splat, ir.Constant(vt, ir.Undefined),
                                 ir.Constant(ir.VectorType(I32, LANES), [0] * LANES))
        return b.icmp_signed("<", ir.Constant(vt, list(range(LANES))), splat)

    def splat(self, x):
        b = self.b
        v = b.insert_element(ir.Constant(VEC, ir.Undefined), x, I32(0))
        return b.shuffle_vector(v, ir.Constant(VEC, ir.Undefined),
                                ir.Constant(ir.VectorType(I32, LANES), [0] * LANES))

    def minimum(self, a, c):
        return self.b.select(self.b.icmp_signed("<", a, c), a, c)

    # ---------------------------------------------------------------- packing
    def pack_b(self, bsrc, rsb, csb, kc, n, packb):
        """packB[p][k][0:NR] = B[k, p*NR : p*NR+NR] (zeros past n), for k < kc."""
        s, b = self.spec, self.b
        if s.b_order == "any":
            return self.pack_b_strided(bsrc, rsb, csb, kc, n, packb)
        zero = ir.Constant(VEC, [0.0] * LANES)

        def panel(j0):
            dst0 = b.mul(j0, _const(s.kc))        # panel p starts at p*NR*KC = j0*KC

            def row(k):
                src = b.add(b.mul(k, rsb), j0)
                dst = b.add(dst0, b.mul(k, _const(s.nr)))
                for v in range(s.nr // LANES):
                    m = self.lane_mask(b.sub(n, b.add(j0, _const(v * LANES))))
                    x = b.call(self.mload, [self.at(bsrc, b.add(src, _const(v * LANES))), I32(4), m, zero])
                    b.store(x, self.at(packb, b.add(dst, _const(v * LANES))), align=4)
            self.loop(_const(0), kc, _const(1), row, "pb.k")
        self.loop(_const(0), n, _const(s.nr), panel, "pb.j")

    def pack_b_strided(self, bsrc, rsb, csb, kc, n, packb):
        """pack_b for any strides: one element at a time, zeros past n."""
        s, b = self.spec, self.b

        def panel(j0):
            dst0 = b.mul(j0, _const(s.kc))

            def row(k):
                dst = b.add(dst0, b.mul(k, _const(s.nr)))
                for j in range(s.nr):
                    col = b.add(j0, _const(j))
                    inside = b.icmp_signed("<", col, n)
                    safe = b.select(inside, col, _const(0))      # never read past the edge
                    x = b.load(self.at(bsrc, b.add(b.mul(k, rsb), b.mul(safe, csb))), typ=F32)
                    b.store(b.select(inside, x, ir.Constant(F32, 0.0)), self.at(packb, b.add(dst, _const(j))))
            self.loop(_const(0), kc, _const(1), row, "pb.k")
        self.loop(_const(0), n, _const(s.nr), panel, "pb.j")

    def pack_a(self, asrc, csa, kc, mc, packa):
        """packA[q][k][0:MR] = A[q*MR : q*MR+MR, k] for an A whose rows are contiguous (rsA=1),
        zeros past mc: MR contiguous floats per k, copied as masked 16-lane vectors."""
        s, b = self.spec, self.b
        zero = ir.Constant(VEC, [0.0] * LANES)
        chunks = range(0, s.mr, LANES)
        store_masks = [ir.Constant(MASK, [int(c + lane < s.mr) for lane in range(LANES)]) for c in chunks]

        def panel(i0):
            dst0 = b.mul(i0, _const(s.kc))
            rows = self.minimum(b.sub(mc, i0), _const(s.mr))
            load_masks = [self.lane_mask(b.sub(rows, _const(c))) for c in chunks]

            def col(k):
                src = b.add(b.mul(k, csa), i0)
                dst = b.add(dst0, b.mul(k, _const(s.mr)))
                for c, lm, sm in zip(chunks, load_masks, store_masks):
                    x = b.call(self.mload, [self.at(asrc, b.add(src, _const(c))), I32(4), lm, zero])
                    b.call(self.mstore, [x, self.at(packa, b.add(dst, _const(c))), I32(4), sm])
            self.loop(_const(0), kc, _const(1), col, "pa.k")
        self.loop(_const(0), mc, _const(s.mr), panel, "pa.i")

    def pack_a_rows(self, asrc, rsa, kc, mc, packa):
        """packA[q][k][0:MR] = A[q*MR : q*MR+MR, k] for an A whose columns are contiguous:
        row by row (contiguous reads), zeros for rows past mc."""
        s, b = self.spec, self.b
        zero = ir.Constant(F32, 0.0)

        def panel(i0):
            dst0 = b.mul(i0, _const(s.kc))
            for i in range(s.mr):
                row = b.add(i0, _const(i))
                valid = b.icmp_signed("<", row, mc)
                src = self.at(asrc, b.mul(b.select(valid, row, _const(0)), rsa))
                dst = self.at(packa, b.add(dst0, _const(i)))

                def col(k, src=src, dst=dst, valid=valid):
                    x = b.load(self.at(src, k), typ=F32)
                    b.store(b.select(valid, x, zero), self.at(dst, b.mul(k, _const(s.mr))))
                self.loop(_const(0), kc, _const(1), col, f"pr.k{i}")
        self.loop(_const(0), mc, _const(s.mr), panel, "pr.i")

    # ---------------------------------------------------------------- micro-kernel
    def micro(self, kc, a_rows, a_step, bpanel, b_step):
        """The MR x NR tile of A[rows, 0:kc] @ Bpanel as MR*NR/16 vector accumulators.
        a_rows[i] points at A's element (row i, k=0); the element at k is a_rows[i] + k*a_step;
        B's NR values for k start at bpanel + k*b_step."""
        s, b = self.spec, self.b
        nv = s.nr // LANES
        pre = b.block
        body = b.append_basic_block("uk.body")
        done = b.append_basic_block("uk.end")
        zero = ir.Constant(VEC, [0.0] * LANES)
        b.cbranch(b.icmp_signed(">", kc, _const(0)), body, done)
        b.position_at_end(body)
        k = b.phi(I64, name="k")
        k.add_incoming(_const(0), pre)
        accs = [[b.phi(VEC) for _ in range(nv)] for _ in range(s.mr)]
        for row in accs:
            for p in row:
                p.add_incoming(zero, pre)
        boff = b.mul(k, b_step)
        bv = [b.load(self.at(bpanel, b.add(boff, _const(v * LANES))), typ=VEC, align=4) for v in range(nv)]
        aoff = b.mul(k, a_step) if not isinstance(a_step, ir.Constant) or a_step.constant != 1 else k
        new = []
        for i in range(s.mr):
            a = self.splat(b.load(self.at(a_rows[i], aoff), typ=F32))
            new.append([b.call(self.fma, [a, bv[v], accs[i][v]]) for v in range(nv)])
        k1 = b.add(k, _const(1))
        k.add_incoming(k1, body)
        for i in range(s.mr):
            for v in range(nv):
                accs[i][v].add_incoming(new[i][v], body)
        b.cbranch(b.icmp_signed("<", k1, kc), body, done)
        b.position_at_end(done)
        out = []
        for i in range(s.mr):
            row = []
            for v in range(nv):
                phi = b.phi(VEC)
                phi.add_incoming(zero, pre)
                phi.add_incoming(new[i][v], body)
                row.append(phi)
            out.append(row)
        return out

    def store_tile(self, accs, c, ldc, mvalid, nvalid, add_old):
        """C[i, v*16 + l] (+)= accs[i][v][l] for i < mvalid, v*16 + l < nvalid."""
        s, b = self.spec, self.b
        zero = ir.Constant(VEC, [0.0] * LANES)
        masks = [self.lane_mask(b.sub(nvalid, _const(v * LANES))) for v in range(s.nr // LANES)]
        for i, row in enumerate(accs):
            with b.if_then(b.icmp_signed(">", mvalid, _const(i))):
                base = b.mul(_const(i), ldc)
                for v, acc in enumerate(row):
                    ptr = self.at(c, b.add(base, _const(v * LANES)))
                    old = b.call(self.mload, [ptr, I32(4), masks[v], zero])
                    val = b.select(add_old, b.fadd(old, acc), acc)
                    b.call(self.mstore, [val, ptr, I32(4), masks[v]])

    # ---------------------------------------------------------------- epilogue
    def epilogue_function(self) -> ir.Function:
        """void epi(i64 r0, i64 r1, i64 c0, i64 c1, ptr out_0.., ptr in_0..): the epilogue
        kernel over rows [r0, r1) and columns [c0, c1) of its (M, N) space; strides are the
        spec's (static). The column loop is contiguous in every output: LLVM vectorizes it."""
        spec = self.spec.epilogue
        n_out, n_in = len(spec.outputs), len(spec.inputs)
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [I64] * 4 + [PTR] * (n_out + n_in)),
                         self.fn.name + ".epilogue")
        fn.linkage = "internal"
        fn.attributes.add("noinline")
        set.add(fn.attributes, '"prefer-vector-width"="512"')
        for a in fn.args[4:]:
            a.add_attribute("noalias")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        e = Emitter(b, fast_ldexp=True)
        r0, r1, c0, c1 = fn.args[:4]
        outs, ins = fn.args[4:4 + n_out], fn.args[4 + n_out:]
        dtypes, odt = spec.input_dtypes, spec.output_dtypes
        cols = spec.shape[1]
        strides = [inp.strides if inp.strides is not None else c_strides(spec.shape) for inp in spec.inputs]

        full = b.icmp_signed("==", b.sub(c1, c0), i64(self.spec.nr))

        def row(b, r):
            def col(b, c):
                def load(i):
                    st = strides[i]
                    off = b.add(b.mul(r, i64(st[0])), b.mul(c, i64(st[1])))
                    t = storage_type(dtypes[i])
                    return from_storage(e, b.load(b.gep(ins[i], [off], source_etype=t), typ=t), dtypes[i])
                vals = lower(e, list(spec.outputs), dtypes, load)
                flat = b.add(b.mul(r, i64(cols)), c)
                for p, v, dt in zip(outs, vals, odt):
                    t = storage_type(dt)
                    b.store(to_storage(e, v, dt), b.gep(p, [flat], source_etype=t))
            # a whole tile's width as a constant trip count: LLVM emits straight vector code
            with b.if_else(full) as (whole, part):
                with whole:
                    counted_loop(b, i64(0), i64(self.spec.nr), lambda b, j: col(b, b.add(c0, j)), "epi.c")
                with part:
                    counted_loop(b, c0, c1, col, "epi.cp")
        counted_loop(b, r0, r1, row, "epi.r")
        b.ret_void()
        return fn

    # ---------------------------------------------------------------- the loop nest
    def build(self) -> ir.Module:
        s, b = self.spec, self.b
        m0, m1, n0, n1, K, A, rsa, csa, B, rsb, csb, C, ldc, packa, packb, accumulate = \
            self.fn.args[:N_FIXED_ARGS]
        extra = list(self.fn.args[N_FIXED_ARGS:])
        n = b.sub(n1, n0)
        acc_flag = b.icmp_signed("!=", accumulate, I32(0))
        # One row of micro-tiles uses each element of B once: packing it would only copy it.
        # Read B in place then (rows contiguous, whole panels only).
        if s.b_order == "rows":
            direct = b.and_(b.icmp_signed("<=", b.sub(m1, m0), _const(s.mr)),
                            b.icmp_signed("==", b.srem(n, _const(s.nr)), _const(0)))
        else:
            direct = ir.Constant(I1, 0)
        b_step = b.select(direct, rsb, _const(s.nr))

        def kslice(pc):
            kc = self.minimum(b.sub(K, pc), _const(s.kc))
            add_old = b.or_(acc_flag, b.icmp_signed(">", pc, _const(0)))
            last = b.icmp_signed(">=", b.add(pc, kc), K)
            bsrc = self.at(B, b.add(b.mul(pc, rsb), b.mul(n0, csb)))
            with b.if_then(b.not_(direct)):
                self.pack_b(bsrc, rsb, csb, kc, n, packb)

            def mblock(ic):
                mc = self.minimum(b.sub(m1, ic), _const(s.mc))
                if s.a_order == "cols":
                    self.pack_a(self.at(A, b.add(b.mul(pc, csa), ic)), csa, kc, mc, packa)
                elif s.a_order == "rows_packed":
                    self.pack_a_rows(self.at(A, b.add(b.mul(ic, rsa), pc)), rsa, kc, mc, packa)

                def jpanel(jr):
                    bpanel = b.select(direct, self.at(bsrc, jr), self.at(packb, b.mul(jr, _const(s.kc))))
                    nvalid = self.minimum(b.sub(n, jr), _const(s.nr))

                    def itile(ir_):
                        mvalid = self.minimum(b.sub(mc, ir_), _const(s.mr))
                        if s.a_order != "rows":
                            panel = self.at(packa, b.mul(ir_, _const(s.kc)))
                            rows = [self.at(panel, _const(i)) for i in range(s.mr)]
                            step = _const(s.mr)
                        else:
                            first = b.add(ic, ir_)
                            last_row = b.sub(b.add(first, mvalid), _const(1))
                            base = self.at(A, pc)
                            # rows past the edge re-read the last valid row (never out of bounds)
                            rows = [self.at(base, b.mul(self.minimum(b.add(first, _const(i)), last_row), rsa))
                                    for i in range(s.mr)]
                            step = _const(1)
                        accs = self.micro(kc, rows, step, bpanel, b_step)
                        row0, col0 = b.add(ic, ir_), b.add(n0, jr)
                        self.store_tile(accs, self.at(C, b.add(b.mul(row0, ldc), col0)), ldc, mvalid,
                                        nvalid, add_old)
                        if self.epi is not None:
                            with b.if_then(last):
                                b.call(self.epi, [row0, b.add(row0, mvalid), col0, b.add(col0, nvalid), *extra])
                    self.loop(_const(0), mc, _const(s.mr), itile, "ir")
                self.loop(_const(0), n, _const(s.nr), jpanel, "jr")
            self.loop(m0, m1, _const(s.mc), mblock, "ic")
        self.loop(_const(0), K, _const(s.kc), kslice, "pc")
        b.ret_void()
        return self.module


def gemm_ir(spec: GemmSpec, symbol: str) -> str:
    """LLVM IR text of the GEMM function `symbol` for `spec`."""
    return str(_Builder(spec, symbol).build())
