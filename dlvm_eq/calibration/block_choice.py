"""Which blocking calibration keeps (issue 36): from each candidate's measured seconds on each
shape, the candidate with the least geometric mean of its time relative to the fastest on that
shape, and only where it beats the shipped blocking (the first candidate) by MARGIN; else the
shipped one stays.

Why relative times and a margin: summed seconds let the largest shape decide alone, and on a
loaded machine its noise is larger than a smaller shape's whole difference. Measured
(benchmarks/conv_gemm_blocks.py, one thread, load 15, 2026-12-08): summed over shapes that
included the CNN's 29 MB second layer, calibration kept per-image products only up to 2**16
multiply-adds, and the CNN's first layer then ran 1.6-2.4x slower (CPU time) with the second
unchanged.

    >>> fastest_blocks([[1.0, 10.0], [0.8, 10.2]])   # 1: 20% faster on one shape, 2% slower on one
    1
"""

from __future__ import annotations

import math

MARGIN = 0.97  # a candidate replaces the shipped blocking only when 3% faster (geometric mean)


def relative_score(seconds: list[list[float]]) -> list[float]:
    """Per candidate, the geometric mean over shapes of its seconds over the shape's fastest."""
    shapes = range(len(seconds[0]))
    best = [min(row[s] for row in seconds) for s in shapes]
    return [
        math.exp(sum(math.log(row[s] / best[s]) for s in shapes) / len(best)) for row in seconds
    ]


def fastest_blocks(seconds: list[list[float]], margin: float = MARGIN) -> int:
    """The index of the candidate to keep: seconds[c][s] is candidate c on shape s, candidate 0
    the shipped blocking."""
    score = relative_score(seconds)
    best = min(range(len(score)), key=lambda c: score[c])
    return best if score[best] < margin * score[0] else 0


__all__ = ["MARGIN", "fastest_blocks", "relative_score"]
