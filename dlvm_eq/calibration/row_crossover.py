"""How long a row may be for a row kernel to keep its costly per-row values on the stack
rather than recompute them (issue 36; codegen/kernels/row_limit.py): calibrate times one
softmax row kernel both ways at a few row lengths and keeps the crossover as the profile's
`row_scratch`.

    >>> crossover((8192, 16384), [1.0, 1.0], [1.2, 0.9])   # kept loses at 16384
    8192

Why a softmax: it is the row kernel programs have most (attention, classifiers), and its kept
value (exp) is the costliest op class a row recomputes; a kernel with cheaper kept values
gains less from keeping, and then the same limit only keeps values a little longer.
"""

from __future__ import annotations

import numpy as np

from ..codegen.kernels import row_limit
from .block_choice import MARGIN
from .measure import fastest_seconds

# row lengths timed: the shipped limit and one step either side (and one below that)
LENGTHS = (8192, 16384, 32768, 65536)
ELEMENTS = 1 << 19  # elements per timed call (2 MiB of f32): rows = ELEMENTS / length


def crossover(lengths, kept: list[float], recomputed: list[float], margin: float = MARGIN) -> int:
    """The longest of `lengths` (increasing) up to which keeping never lost: recomputing wins
    at a length only when `margin` faster. Where it wins at the shortest, half that length."""
    best = lengths[0] // 2
    for n, k, r in zip(lengths, kept, recomputed):
        if r < margin * k:
            break
        best = n
    return best


def _softmax(rows: int, cols: int, way: str):
    from ..codegen import KernelInput, Load, unary
    from ..codegen.kernels.rows import RowSpec
    from ..codegen.runtime.row_kernel import RowKernel

    v = Load(0)
    spec = RowSpec(
        f"calibrate_softmax_{way}",  # kept and recomputed: two kernels in the cache
        rows,
        cols,
        [KernelInput("f32")],
        [(v, "max", None), (unary("exp", v - Load(1)), "add", None)],
        [unary("exp", v - Load(1)) / Load(2)],
    )
    return RowKernel(spec, threads=1)


def row_scratch(lengths=LENGTHS, cap_s: float = 0.05) -> int:
    """The measured crossover on this host (one thread, each way the fastest of a few calls)."""
    before = row_limit.SCRATCH
    rng = np.random.default_rng(0)
    kept, recomputed = [], []
    try:
        for n in lengths:
            x = rng.standard_normal((max(1, ELEMENTS // n), n), dtype=np.float32)
            for way, limit, out in (("kept", n, kept), ("recomputed", n - 1, recomputed)):
                row_limit.use_scratch(limit)
                k = _softmax(x.shape[0], n, way)
                out.append(fastest_seconds(lambda k=k: k(x), repeats=7, cap_s=cap_s))
    finally:
        row_limit.use_scratch(before)
    return crossover(lengths, kept, recomputed)


__all__ = ["ELEMENTS", "LENGTHS", "crossover", "row_scratch"]
