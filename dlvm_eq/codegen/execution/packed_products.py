"""A scan's small products with a loop-invariant B (a weight: a `with` operand of the body)
run through our GEMM (cpu/gemm_ir.py) reading B packed once per call, before the loop,
instead of through OpenBLAS, which packs B again at every step.

    lp, packs = prepack(lp, plan, with_slots)       # SGEMM records -> CALLs of our GEMM
    bufs = pack_buffers(packs)                      # per records table
    pack_withs(packs, withs_by_slot, bufs)          # per call, before the loop

Why (benchmarks/rnn.py, LSTM hidden 256, batch 16, one thread, 2-core AVX2 EPYC): a 16 x 256
@ 256 x 1024 product took 148-162 us through OpenBLAS, of which its packing of the weight
(sgemm_itcopy / incopy: 22% of the whole step's samples) is most of the difference, against
104-118 us through our 6 x 16 micro-tile reading the weight pre-packed (tests/test_packed_products.py
checks the results). A product whose C has more than MAX_ROWS rows keeps OpenBLAS: there its
packing is spread over many rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..planning.loop_plan import CALL, NO_TRANS, SGEMM, TRANS, LoopPlan, Ptr, Record
from ..runtime.gemm_runtime import (
    WIDE,
    pack_b_panels,
    packed_b_gemm,
    prepacking_enabled,
)

PREPACK = True  # off: every product of a loop goes to OpenBLAS (benchmarks/rnn.py compares)
MAX_ROWS = 64  # rows of C: at most this many for our GEMM with a pre-packed B
MIN_DEPTH_WIDTH = 1 << 14  # k * n of B: smaller weights stay with OpenBLAS (16x64x256: a tie)
SCRATCH = ("gemm scratch",)  # the key of a table's packed-A scratch (A read by columns)


@dataclass(frozen=True)
class Pack:
    """B of k x n floats read from `slot` at `offset` bytes, element (kk, j) at kk*ld + j
    (or j*ld + kk when `trans`)."""

    slot: int
    offset: int
    trans: bool
    k: int
    n: int
    ld: int

    def view(self, w: np.ndarray) -> np.ndarray:
        flat = w.reshape(-1)[self.offset // 4 :]
        strides = (4, self.ld * 4) if self.trans else (self.ld * 4, 4)
        return np.lib.stride_tricks.as_strided(flat, (self.k, self.n), strides, writeable=False)

    def fits(self, size: int) -> bool:
        rows, cols = (self.n, self.k) if self.trans else (self.k, self.n)
        return self.offset % 4 == 0 and self.offset // 4 + (rows - 1) * self.ld + cols <= size


def prepack(lp: LoopPlan, plan, with_slots) -> tuple[LoopPlan, list[Pack]]:
    """`lp` with each float32 SGEMM record whose B is a loop-invariant slot in `with_slots`
    (and whose C has at most MAX_ROWS rows) replaced by a CALL of our GEMM on B packed once
    (its fn ("packed_gemm", address), its B the per-call key ("packed", j)); the packs."""
    if not (PREPACK and prepacking_enabled()):
        return lp, []
    from ..cpu.gemm_ir import B_PACKED

    invariant = set(with_slots)
    packs: list[Pack] = []
    records = []
    for rec in lp.records:
        if rec.kind != SGEMM:
            records.append(rec)
            continue
        _, ta, tb, m, n, k, a, lda, b, ldb, c, ldc = rec.args
        size = int(np.prod(plan.slots[b.slot].shape, dtype=np.int64)) if isinstance(b, Ptr) else 0
        pack = Pack(b.slot, b.offset, tb == TRANS, k, n, ldb) if size else None
        if (
            pack is None
            or b.slot not in invariant
            or m > MAX_ROWS
            or k * n < MIN_DEPTH_WIDTH
            or not pack.fits(size)
        ):
            records.append(rec)
            continue
        gemm = packed_b_gemm(m)  # the tile by m (few rows: gemm_tiles.AVX512_SHORT)
        if pack not in packs:
            packs.append(pack)
        j = packs.index(pack)
        by_cols = ta != NO_TRANS
        flags = gemm.layout_flags("cols" if by_cols else "rows", 1 if by_cols else lda, False)
        rsa, csa = (1, lda) if by_cols else (lda, 1)
        args = [0, m, 0, n, k, a, rsa, csa, ("packed", j), 0, 0, c, ldc, SCRATCH, 0]
        args += [flags | B_PACKED, 0, 0]
        records.append(Record(CALL, ("packed_gemm", gemm.address), args))
    if not packs:
        return lp, []
    return LoopPlan(records, lp.carries, lp.xs, lp.direct_ys, lp.swapped), packs


def scratch_buffer() -> np.ndarray:
    """Packed-A scratch for one records table (the records run one after another), for
    either tile `packed_b_gemm` picks (their MC can differ under a calibrated profile)."""
    from ..cpu.gemm_ir import GemmSpec
    from ..runtime.gemm_runtime import SHORT  # (by name at call time: use_blocks edits it in place)

    return np.empty(max(GemmSpec(**t).scratch(0)[0] for t in (WIDE, SHORT)), np.float32)


def pack_buffers(packs: list[Pack]) -> list[np.ndarray]:
    """One buffer per pack, kept with a records table (written at each call)."""
    if not packs:
        return []
    nr = WIDE["nr"]  # both tiles' NR (packed_b_gemm); read from the dict: compiles no GEMM
    return [np.empty((-(-p.n // nr), p.k, nr), np.float32) for p in packs]


def pack_withs(packs: list[Pack], withs: dict, bufs: list[np.ndarray]) -> None:
    """Pack each B from this call's loop-invariant arrays (`withs`: slot -> array)."""
    nr = WIDE["nr"]
    for p, buf in zip(packs, bufs):
        pack_b_panels(p.view(withs[p.slot]), nr, buf)


__all__ = [
    "MAX_ROWS",
    "PREPACK",
    "SCRATCH",
    "Pack",
    "pack_buffers",
    "pack_withs",
    "prepack",
    "scratch_buffer",
]
