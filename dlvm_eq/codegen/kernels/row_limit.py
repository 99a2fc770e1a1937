"""How long a row may be for a row kernel (cpu/rows_ir.py) to keep its costly per-row values
(softmax's exp(x - max)) in a stack buffer rather than recompute them in the map pass (issue
36): a calibrated profile's `row_scratch` (calibration/row_crossover.py measures the crossover
on this host), else the shipped SHIPPED_SCRATCH. Kept and recomputed rows give the same bits
(tests/test_row_scratch.py), so the limit moves time only.

    >>> keeps(20000, limit=16384)
    False

A module of its own, without LLVM, because the kernel cache's key (kernel_kind) and the cost
model (calibration/plan_cost.py) read it where no IR is built.

Shared state: SCRATCH, set by use_scratch once per compile (pipeline/native.py), as the GEMM's
and the convolutions' blocks are.
"""

from __future__ import annotations

# Row elements kept on the stack for the map pass (128 KiB of f32 per kept value; threads have
# glibc's 8 MiB stacks). 8192 -> 32768 (issue 36): a softmax over rows of 16384, one thread, CPU
# time, AVX-512 EPYC, load 11-12: 0.585-0.633 ms recomputing exp, 0.455-0.456 kept (0.72-0.78x);
# 65536 gained nothing more at 16384 and 0.58 -> 0.46 ms at 65536 but costs 256 KiB a value.
# On AVX2 the exp that keeping saves costs twice the instructions, and a kept row (128 KiB) with
# its input still fits the 512 KiB L2 of the AVX2 EPYC, so the same holds there.
SHIPPED_SCRATCH = 32768
MAX_SCRATCH = 1 << 16  # 256 KiB of f32 a kept value: the most a profile may ask of a stack
SCRATCH = SHIPPED_SCRATCH  # the limit in use


def use_scratch(limit: int | None) -> None:
    """Keep row values for rows of up to `limit` elements (None or 0: SHIPPED_SCRATCH; at most
    MAX_SCRATCH)."""
    global SCRATCH
    SCRATCH = min(int(limit), MAX_SCRATCH) if limit else SHIPPED_SCRATCH


def keeps(cols: int, limit: int | None = None) -> bool:
    """Whether a row of `cols` elements keeps its values under `limit` (None: the one in use)."""
    return cols <= (SCRATCH if limit is None else limit)


def kernel_kind(cols: int) -> str:
    """The kernel cache's kind for a row kernel of `cols` columns: "rows" where the limit in use
    decides as the shipped one does, else a kind naming the other choice, so that a kernel
    compiled under another limit is not reused for this one."""
    keep = keeps(cols)
    if keep == keeps(cols, SHIPPED_SCRATCH):
        return "rows"
    return "rows-kept" if keep else "rows-recomputed"


__all__ = ["MAX_SCRATCH", "SHIPPED_SCRATCH", "keeps", "kernel_kind", "use_scratch"]
