"""Readable units for the cost model's estimated seconds (reports of the optimizer, the fusion
decision and the compile pipeline all print them).

    >>> seconds_text(2.5e-6)
    '2.5 us'
"""

from __future__ import annotations


def seconds_text(s: float) -> str:
    """Estimated seconds in a readable unit."""
    if s == float("inf"):
        return "inf"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.4g} {unit}"
    return f"{s / 1e-9:.4g} ns"
