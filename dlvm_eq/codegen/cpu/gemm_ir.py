"""Our own float32 GEMM for the host CPU, in LLVM IR: C[m0:m1, n0:n1] (+)= A @ B, blocked and
packed like BLIS/GotoBLAS, with a register-tiled micro-kernel of MR x NR accumulators (NR =
one or more vectors of `GemmSpec.lanes` floats: 16 for AVX-512, 8 for AVX2; the runtime's
gemm_tiles.py picks the shapes per host), and an optional elementwise epilogue applied to each tile of C once it is
final (bias, activation, ...), so that the work after a matmul costs no pass of its own.

ABI (one call computes one block of C; threads take disjoint blocks):
    void gemm(i64 m0, i64 m1, i64 n0, i64 n1, i64 K,
              ptr A, i64 rsA, i64 csA, ptr B, i64 rsB, i64 csB, ptr C, i64 ldc,
              ptr packA, ptr packB, i32 flags, ptr epilogue, ptr epilogue_args)
C's column stride is 1. The operands' layouts are run-time flags, so that one compiled
function per micro-tile shape serves every product (compiling one takes ~100 ms):
  A_COLS         A's row stride is 1 (a transposed operand such as X.T): blocks of A are packed
                 into MR-row panels (MR contiguous floats per k);
  A_ROWS_PACKED  A's column stride is 1 and it is packed all the same (a transposing copy): for
                 row strides whose MR rows share few L1 sets (1024 floats: every row in one set;
                 1024^3 ran at half speed unpacked);
  neither        A's column stride is 1: the micro-kernel broadcasts A's elements straight from
                 its rows (no packing; MR row streams);
  B_STRIDED      B's columns are not contiguous (e.g. W.T): B is packed element by element
                 instead of with vector copies;
  B_PACKED       B was packed before the call, for the whole depth K (gemm_runtime's
                 pack_b_panels: panel p, the NR columns from p*NR, at B + p*K*NR, row k of it
                 at + k*NR); n0 is a multiple of NR; nothing is packed and rsB, csB are unused
                 (a loop's weight, packed once for all its steps: execution/packed_products.py);
  ACCUMULATE     C += A @ B instead of C = A @ B.
B is packed into NR-column panels (zero-padded at the right edge) for each KC-deep slice of K;
a call whose rows fit in one micro-tile uses each element of B once and reads B in place
(columns contiguous, whole panels). packA needs MC*KC (+16) floats, packB
KC*round_up(n1-n0, NR) floats (`GemmSpec.scratch`).
`epilogue` (or null): void epi(i64 r0, i64 r1, i64 c0, i64 c1, ptr args), an elementwise
kernel over C's space (`epilogue_ir`), called on each tile once its last K slice is stored,
while the tile is in L1; `epilogue_args` are its pointers (outputs, then inputs).

Why not only BLAS: numpy's OpenBLAS does the MLP step's 256x784x256 products at 230-270
GFLOP/s on this machine's two cores; this micro-kernel runs at ~160 GFLOP/s on one core
(measured), the epilogue removes the elementwise pass after a matmul, and OpenBLAS's threads
busy-wait for ~100 ms after each call, competing with our own workers (gemm_runtime).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ..kernels.kernel_spec import KernelSpec, c_strides
from ..llvm.emitter import Emitter
from ..llvm.loops import counted_loop, i64
from ..llvm.lower_expr import from_storage, lower, storage_type, to_storage

F32 = ir.FloatType()
I1 = ir.IntType(1)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()
LANES = 16  # float32 lanes of an AVX-512 vector (the default tile's)
N_ARGS = 18  # the GEMM's arguments (the worker pool passes up to 32)
ACCUMULATE, A_COLS, A_ROWS_PACKED, B_STRIDED, B_PACKED = 1, 2, 4, 8, 16


@dataclass(frozen=True)
class GemmSpec:
    mr: int = 12  # micro-tile rows
    nr: int = 32  # micro-tile columns (a multiple of LANES)
    kc: int = 256  # depth of a K slice (B's micro-panel KC x NR stays in L1)
    mc: int = 144  # rows of A per packed block (a multiple of mr)
    lanes: int = LANES  # float32 lanes of one vector: 16 (AVX-512) or 8 (AVX2)

    def __post_init__(self):
        if self.lanes not in (8, 16) or self.nr % self.lanes or self.mc % self.mr:
            raise ValueError(
                "lanes must be 8 or 16, nr a multiple of lanes and mc a multiple of mr"
            )

    def scratch(self, n: int) -> tuple[int, int]:
        """(packA, packB) sizes in floats for blocks n columns wide."""
        return self.mc * self.kc + self.lanes, self.kc * (-(-n // self.nr) * self.nr)


def check_epilogue(spec: KernelSpec, c_input: int) -> None:
    """An epilogue is a 2-D map whose input `c_input` reads C (float32, contiguous)."""
    if (
        not isinstance(spec, KernelSpec)
        or len(spec.shape) != 2
        or not 0 <= c_input < len(spec.inputs)
        or spec.input_dtypes[c_input] != "f32"
        or spec.inputs[c_input].strides not in (None, c_strides(spec.shape))
    ):
        raise ValueError("a GEMM epilogue is a 2-D map reading C (float32, contiguous)")


def _const(v: int) -> ir.Constant:
    return i64(v)


class _Builder:
    def __init__(self, spec: GemmSpec, symbol: str):
        self.spec = spec
        self.lanes = L = spec.lanes
        self.vec = VEC = ir.VectorType(F32, L)
        self.mask = MASK = ir.VectorType(I1, L)
        self.module = ir.Module(name="dq_gemm")
        self.fma = ir.Function(
            self.module, ir.FunctionType(VEC, [VEC, VEC, VEC]), f"llvm.fma.v{L}f32"
        )
        self.mload = ir.Function(
            self.module, ir.FunctionType(VEC, [PTR, I32, MASK, VEC]), f"llvm.masked.load.v{L}f32.p0"
        )
        self.mstore = ir.Function(
            self.module,
            ir.FunctionType(ir.VoidType(), [VEC, PTR, I32, MASK]),
            f"llvm.masked.store.v{L}f32.p0",
        )
        args = [I64] * 5 + [PTR, I64, I64, PTR, I64, I64, PTR, I64, PTR, PTR, I32, PTR, PTR]
        self.fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), args), symbol)
        for i in (5, 8, 11, 13, 14):
            self.fn.args[i].add_attribute("noalias")
        self.epi_type = ir.FunctionType(ir.VoidType(), [I64] * 4 + [PTR])
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))

    # ---------------------------------------------------------------- helpers
    def loop(self, start, end, step, body, name):
        """for (i = start; i < end; i += step) body(i)."""
        counted_loop(self.b, start, end, lambda b, i: body(i), name, step)

    def at(self, base, idx):
        return self.b.gep(base, [idx], source_etype=F32)

    def lane_mask(self, valid):
        """<lanes x i1>: lane l < valid."""
        b = self.b
        vt = ir.VectorType(I64, self.lanes)
        splat = b.insert_element(ir.Constant(vt, ir.Undefined), valid, I32(0))
        splat = b.shuffle_vector(
            splat,
            ir.Constant(vt, ir.Undefined),
            ir.Constant(ir.VectorType(I32, self.lanes), [0] * self.lanes),
        )
        return b.icmp_signed("<", ir.Constant(vt, list(range(self.lanes))), splat)

    def splat(self, x):
        b = self.b
        v = b.insert_element(ir.Constant(self.vec, ir.Undefined), x, I32(0))
        return b.shuffle_vector(
            v,
            ir.Constant(self.vec, ir.Undefined),
            ir.Constant(ir.VectorType(I32, self.lanes), [0] * self.lanes),
        )

    def minimum(self, a, c):
        return self.b.select(self.b.icmp_signed("<", a, c), a, c)

    # ---------------------------------------------------------------- packing
    def pack_b(self, bsrc, rsb, csb, kc, n, packb):
        """packB[p][k][0:NR] = B[k, p*NR : p*NR+NR] (zeros past n), for k < kc: vector copies
        (B's columns contiguous), or element by element (`self.b_strided`)."""
        b = self.b
        with b.if_else(self.b_strided) as (strided, rows):
            with strided:
                self.pack_b_strided(bsrc, rsb, csb, kc, n, packb)
            with rows:
                self.pack_b_rows(bsrc, rsb, kc, n, packb)

    def pack_b_rows(self, bsrc, rsb, kc, n, packb):
        s, b = self.spec, self.b
        zero = ir.Constant(self.vec, [0.0] * self.lanes)

        def panel(j0):
            dst0 = b.mul(j0, _const(s.kc))  # panel p starts at p*NR*KC = j0*KC

            def row(k):
                src = b.add(b.mul(k, rsb), j0)
                dst = b.add(dst0, b.mul(k, _const(s.nr)))
                for v in range(s.nr // self.lanes):
                    m = self.lane_mask(b.sub(n, b.add(j0, _const(v * self.lanes))))
                    x = b.call(
                        self.mload,
                        [self.at(bsrc, b.add(src, _const(v * self.lanes))), I32(4), m, zero],
                    )
                    b.store(x, self.at(packb, b.add(dst, _const(v * self.lanes))), align=4)

            self.loop(_const(0), kc, _const(1), row, "pb.k")

        self.loop(_const(0), n, _const(s.nr), panel, "pb.j")

    def pack_b_strided(self, bsrc, rsb, csb, kc, n, packb):
        """pack_b for any strides: one element at a time (loops, not unrolled: compile time)."""
        s, b = self.spec, self.b
        zero = ir.Constant(F32, 0.0)

        def panel(j0):
            dst0 = b.mul(j0, _const(s.kc))

            def col(j):
                c = b.add(j0, j)
                inside = b.icmp_signed("<", c, n)
                src = self.at(
                    bsrc, b.mul(b.select(inside, c, _const(0)), csb)
                )  # never past the edge

                def row(k):
                    x = b.load(self.at(src, b.mul(k, rsb)), typ=F32)
                    b.store(
                        b.select(inside, x, zero),
                        self.at(packb, b.add(dst0, b.add(b.mul(k, _const(s.nr)), j))),
                    )

                self.loop(_const(0), kc, _const(1), row, "pbs.k")

            self.loop(_const(0), _const(s.nr), _const(1), col, "pbs.j")

        self.loop(_const(0), n, _const(s.nr), panel, "pbs.p")

    def pack_a(self, asrc, csa, kc, mc, packa):
        """packA[q][k][0:MR] = A[q*MR : q*MR+MR, k] for an A whose rows are contiguous (rsA=1),
        zeros past mc: MR contiguous floats per k, copied as masked 16-lane vectors."""
        s, b = self.spec, self.b
        zero = ir.Constant(self.vec, [0.0] * self.lanes)
        chunks = range(0, s.mr, self.lanes)
        store_masks = [
            ir.Constant(self.mask, [int(c + lane < s.mr) for lane in range(self.lanes)])
            for c in chunks
        ]

        def panel(i0):
            dst0 = b.mul(i0, _const(s.kc))
            rows = self.minimum(b.sub(mc, i0), _const(s.mr))
            load_masks = [self.lane_mask(b.sub(rows, _const(c))) for c in chunks]

            def col(k):
                src = b.add(b.mul(k, csa), i0)
                dst = b.add(dst0, b.mul(k, _const(s.mr)))
                for c, lm, sm in zip(chunks, load_masks, store_masks):
                    x = b.call(self.mload, [self.at(asrc, b.add(src, _const(c))), I32(4), lm, zero])
                    if self.lanes == 8:
                        # AVX2's masked store (vmaskmovps) is slow; a whole vector writes up to
                        # lanes-1 floats past this k's MR, which the next k (or the panel after,
                        # packed later) overwrites, and the last panel's into scratch padding
                        b.store(x, self.at(packa, b.add(dst, _const(c))), align=4)
                    else:
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

            def one_row(i):
                r = b.add(i0, i)
                valid = b.icmp_signed("<", r, mc)
                src = self.at(asrc, b.mul(b.select(valid, r, _const(0)), rsa))

                def col(k):
                    x = b.load(self.at(src, k), typ=F32)
                    b.store(
                        b.select(valid, x, zero),
                        self.at(packa, b.add(dst0, b.add(b.mul(k, _const(s.mr)), i))),
                    )

                self.loop(_const(0), kc, _const(1), col, "pr.k")

            self.loop(_const(0), _const(s.mr), _const(1), one_row, "pr.i")

        self.loop(_const(0), mc, _const(s.mr), panel, "pr.q")

    # ---------------------------------------------------------------- micro-kernel
    def micro(self, kc, a_rows, a_step, bpanel, b_step):
        """The MR x NR tile of A[rows, 0:kc] @ Bpanel as MR*NR/16 vector accumulators.
        a_rows[i] points at A's element (row i, k=0); the element at k is a_rows[i] + k*a_step;
        B's NR values for k start at bpanel + k*b_step."""
        s, b = self.spec, self.b
        nv = s.nr // self.lanes
        pre = b.block
        body = b.append_basic_block("uk.body")
        done = b.append_basic_block("uk.end")
        zero = ir.Constant(self.vec, [0.0] * self.lanes)
        b.cbranch(b.icmp_signed(">", kc, _const(0)), body, done)
        b.position_at_end(body)
        k = b.phi(I64, name="k")
        k.add_incoming(_const(0), pre)
        accs = [[b.phi(self.vec) for _ in range(nv)] for _ in range(s.mr)]
        for row in accs:
            for p in row:
                p.add_incoming(zero, pre)
        boff = b.mul(k, b_step)
        bv = [
            b.load(self.at(bpanel, b.add(boff, _const(v * self.lanes))), typ=self.vec, align=4)
            for v in range(nv)
        ]
        aoff = (
            b.mul(k, a_step) if not isinstance(a_step, ir.Constant) or a_step.constant != 1 else k
        )
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
                phi = b.phi(self.vec)
                phi.add_incoming(zero, pre)
                phi.add_incoming(new[i][v], body)
                row.append(phi)
            out.append(row)
        return out

    def store_tile(self, accs, c, ldc, mvalid, nvalid, add_old):
        """C[i, v*lanes + l] (+)= accs[i][v][l] for i < mvalid, v*lanes + l < nvalid."""
        s, b = self.spec, self.b
        if self.lanes == 8:
            # whole-width tiles (most) with plain vector accesses: AVX2's masked store is slow
            with b.if_else(b.icmp_signed("==", nvalid, _const(s.nr))) as (whole, part):
                with whole:
                    self.store_rows(accs, c, ldc, mvalid, nvalid, add_old, masked=False)
                with part:
                    self.store_rows(accs, c, ldc, mvalid, nvalid, add_old, masked=True)
        else:
            self.store_rows(accs, c, ldc, mvalid, nvalid, add_old, masked=True)

    def store_rows(self, accs, c, ldc, mvalid, nvalid, add_old, masked: bool):
        s, b = self.spec, self.b
        zero = ir.Constant(self.vec, [0.0] * self.lanes)
        masks = [
            self.lane_mask(b.sub(nvalid, _const(v * self.lanes))) for v in range(s.nr // self.lanes)
        ]
        for i, row in enumerate(accs):
            with b.if_then(b.icmp_signed(">", mvalid, _const(i))):
                base = b.mul(_const(i), ldc)
                for v, acc in enumerate(row):
                    ptr = self.at(c, b.add(base, _const(v * self.lanes)))
                    if masked:
                        old = b.call(self.mload, [ptr, I32(4), masks[v], zero])
                    else:
                        old = b.load(ptr, typ=self.vec, align=4)
                    val = b.select(add_old, b.fadd(old, acc), acc)
                    if masked:
                        b.call(self.mstore, [val, ptr, I32(4), masks[v]])
                    else:
                        b.store(val, ptr, align=4)

    # ---------------------------------------------------------------- the loop nest
    def build(self) -> ir.Module:
        s, b = self.spec, self.b
        (
            m0,
            m1,
            n0,
            n1,
            K,
            A,
            rsa,
            csa,
            B,
            rsb,
            csb,
            C,
            ldc,
            packa,
            packb,
            flags,
            epi,
            epi_args,
        ) = self.fn.args

        def flag(bit):
            return b.icmp_signed("!=", b.and_(flags, I32(bit)), I32(0))

        acc_flag, a_cols, a_rows_packed, self.b_strided, b_packed = (
            flag(f) for f in (ACCUMULATE, A_COLS, A_ROWS_PACKED, B_STRIDED, B_PACKED)
        )
        a_packed = b.or_(a_cols, a_rows_packed)
        has_epi = b.icmp_unsigned("!=", b.ptrtoint(epi, I64), _const(0))
        n = b.sub(n1, n0)
        # One row of micro-tiles uses each element of B once: packing it would only copy it.
        # Read B in place then (columns contiguous, whole panels only).
        direct = b.and_(
            b.not_(b.or_(self.b_strided, b_packed)),
            b.and_(
                b.icmp_signed("<=", b.sub(m1, m0), _const(s.mr)),
                b.icmp_signed("==", b.srem(n, _const(s.nr)), _const(0)),
            ),
        )
        b_step = b.select(direct, rsb, _const(s.nr))

        # K slices of equal depth, at most KC: 784 = 4 x 196 rather than 3 x 256 + 16 (a last
        # slice of 16 still costs a pass over C and a packing of B)
        slices = b.sdiv(b.add(K, _const(s.kc - 1)), _const(s.kc))
        slices = b.select(
            b.icmp_signed(">", slices, _const(0)), slices, _const(1)
        )  # K = 0: no division by 0
        kstep = b.sdiv(b.add(K, b.sub(slices, _const(1))), slices)

        def kslice(pc):
            kc = self.minimum(b.sub(K, pc), kstep)
            add_old = b.or_(acc_flag, b.icmp_signed(">", pc, _const(0)))
            run_epi = b.and_(has_epi, b.icmp_signed(">=", b.add(pc, kc), K))
            bsrc = self.at(B, b.add(b.mul(pc, rsb), b.mul(n0, csb)))
            with b.if_then(b.not_(b.or_(direct, b_packed))):
                self.pack_b(bsrc, rsb, csb, kc, n, packb)
            # B packed before the call (pack_b_once): panel p of the whole depth K at
            # B + p*K*NR, slice pc at + pc*NR
            prepacked = self.at(
                B,
                b.add(
                    b.mul(b.sdiv(n0, _const(s.nr)), b.mul(K, _const(s.nr))), b.mul(pc, _const(s.nr))
                ),
            )

            def mblock(ic):
                mc = self.minimum(b.sub(m1, ic), _const(s.mc))
                with b.if_then(a_cols):
                    self.pack_a(self.at(A, b.add(b.mul(pc, csa), ic)), csa, kc, mc, packa)
                with b.if_then(a_rows_packed):
                    self.pack_a_rows(self.at(A, b.add(b.mul(ic, rsa), pc)), rsa, kc, mc, packa)

                def jpanel(jr):
                    bpanel = b.select(
                        direct, self.at(bsrc, jr), self.at(packb, b.mul(jr, _const(s.kc)))
                    )
                    bpanel = b.select(b_packed, self.at(prepacked, b.mul(jr, K)), bpanel)
                    nvalid = self.minimum(b.sub(n, jr), _const(s.nr))

                    def itile(ir_):
                        mvalid = self.minimum(b.sub(mc, ir_), _const(s.mr))
                        row0, col0 = b.add(ic, ir_), b.add(n0, jr)
                        c = self.at(C, b.add(b.mul(row0, ldc), col0))

                        panel = self.at(packa, b.mul(ir_, _const(s.kc)))
                        last_row = b.sub(b.add(row0, mvalid), _const(1))
                        base = self.at(A, pc)
                        # rows past the edge re-read the last valid row (never out of bounds)
                        in_place = [
                            self.at(
                                base, b.mul(self.minimum(b.add(row0, _const(i)), last_row), rsa)
                            )
                            for i in range(s.mr)
                        ]
                        if self.lanes == 8:
                            # AVX2 has half the registers' width: a micro-kernel per way of
                            # reading A, so that the packed one has one pointer and constant
                            # offsets (a shared one kept MR row pointers, spilled to the stack)
                            with b.if_else(a_packed) as (packed, rows_in_place):
                                with packed:
                                    accs = self.micro(
                                        kc,
                                        [self.at(panel, _const(i)) for i in range(s.mr)],
                                        _const(s.mr),
                                        bpanel,
                                        b_step,
                                    )
                                    self.store_tile(accs, c, ldc, mvalid, nvalid, add_old)
                                with rows_in_place:
                                    accs = self.micro(kc, in_place, _const(1), bpanel, b_step)
                                    self.store_tile(accs, c, ldc, mvalid, nvalid, add_old)
                        else:
                            # one micro-kernel for both ways of reading A: row pointers into the
                            # packed panel (constant offsets) or into A itself
                            rows = [
                                b.select(a_packed, self.at(panel, _const(i)), p)
                                for i, p in enumerate(in_place)
                            ]
                            step = b.select(a_packed, _const(s.mr), _const(1))
                            accs = self.micro(kc, rows, step, bpanel, b_step)
                            self.store_tile(accs, c, ldc, mvalid, nvalid, add_old)
                        with b.if_then(run_epi):
                            b.call(
                                FnPtr(epi, self.epi_type),
                                [row0, b.add(row0, mvalid), col0, b.add(col0, nvalid), epi_args],
                            )

                    self.loop(_const(0), mc, _const(s.mr), itile, "ir")

                self.loop(_const(0), n, _const(s.nr), jpanel, "jr")

            self.loop(m0, m1, _const(s.mc), mblock, "ic")

        self.loop(_const(0), K, kstep, kslice, "pc")
        b.ret_void()
        return self.module


class FnPtr:
    """A pointer argument as the callee of an indirect call of a known function type
    (llvmlite's CallInstr reads the callee's `function_type` and reference)."""

    def __init__(self, ptr, fnty: ir.FunctionType):
        self.ptr, self.function_type, self.type = ptr, fnty, PTR

    def get_reference(self) -> str:
        return self.ptr.get_reference()


def gemm_ir(spec: GemmSpec, symbol: str) -> str:
    """LLVM IR text of the GEMM function `symbol` for `spec`."""
    return str(_Builder(spec, symbol).build())


def epilogue_ir(spec: KernelSpec, symbol: str, width: int = 32) -> str:
    """LLVM IR of `void symbol(i64 r0, i64 r1, i64 c0, i64 c1, ptr args)`: the elementwise
    kernel `spec` over rows [r0, r1) and columns [c0, c1) of its 2-D space, args[j] the j-th
    pointer (outputs, then inputs). Strides are the spec's (static); a whole tile's width (the
    wide micro-tile's NR, `width`) is a constant trip count, which LLVM turns into straight
    vector code."""
    from .llvm_cpu import has_avx512

    module = ir.Module(name="dq_epilogue")
    n_out, n_in = len(spec.outputs), len(spec.inputs)
    # The body takes its pointers as noalias parameters (pointers loaded from `args` would
    # carry no aliasing facts: the vectorizer then versions every loop with run-time overlap
    # checks, and compiling took 6x as long); the entry point loads them and calls it inline.
    body = ir.Function(
        module, ir.FunctionType(ir.VoidType(), [I64] * 4 + [PTR] * (n_out + n_in)), symbol + ".body"
    )
    body.linkage = "internal"
    body.attributes.add("alwaysinline")
    for a in body.args[4:]:
        a.add_attribute("noalias")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64] * 4 + [PTR]), symbol)
    for f in (fn, body):
        set.add(f.attributes, '"prefer-vector-width"="512"')
    entry = ir.IRBuilder(fn.append_basic_block("entry"))
    ptrs = [
        entry.load(entry.gep(fn.args[4], [i64(j)], source_etype=PTR), typ=PTR)
        for j in range(n_out + n_in)
    ]
    entry.call(body, [*fn.args[:4], *ptrs])
    entry.ret_void()
    b = ir.IRBuilder(body.append_basic_block("entry"))
    e = Emitter(b, fast_ldexp=has_avx512())
    r0, r1, c0, c1 = body.args[:4]
    outs, ins = body.args[4 : 4 + n_out], body.args[4 + n_out :]
    dtypes, odt = spec.input_dtypes, spec.output_dtypes
    cols = spec.shape[1]
    strides = [
        inp.strides if inp.strides is not None else c_strides(spec.shape) for inp in spec.inputs
    ]
    full = b.icmp_signed("==", b.sub(c1, c0), i64(width))

    def row(b, r):
        def col(b, c):
            def load(i):
                st = strides[i]
                off = b.add(b.mul(r, i64(st[0])), b.mul(c, i64(st[1])))
                t = storage_type(dtypes[i])
                return from_storage(
                    e, b.load(b.gep(ins[i], [off], source_etype=t), typ=t), dtypes[i]
                )

            vals = lower(e, list(spec.outputs), dtypes, load)
            flat = b.add(b.mul(r, i64(cols)), c)
            for p, v, dt in zip(outs, vals, odt):
                t = storage_type(dt)
                b.store(to_storage(e, v, dt), b.gep(p, [flat], source_etype=t))

        with b.if_else(full) as (whole, part):
            with whole:
                counted_loop(b, i64(0), i64(width), lambda b, j: col(b, b.add(c0, j)), "epi.c")
            with part:
                counted_loop(b, c0, c1, col, "epi.cp")

    counted_loop(b, r0, r1, row, "epi.r")
    b.ret_void()
    return str(module)
