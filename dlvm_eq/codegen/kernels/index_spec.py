"""Gathers, scatters and scans as kernel specs: `IndexSpec` (what a compiled kernel computes)
and `IndexExtents` (the sizes it is called with).

Every such op sees its arrays as (outer, axis, inner) blocks, C-contiguous: the axes before
`axis`, the indexed (or scanned) axis, and the axes after it, whose `inner` elements are one
contiguous row that the kernels copy or add as a vector loop.

    take         out[a, j, :] = x[a, ids[j], :]                    x: (outer, size, inner)
    scatterAdd   out[a, s, :] = sum of g[a, j, :] over ids[j] == s, j ascending
    sliceScatter out[a, first + k*step, :] = g[a, k, :], zeros elsewhere
    cumsum       out[a, i, :] = x[a, 0, :] + ... + x[a, i, :]   (i..n-1 with reverse)

A spec fixes only the kind and the element type, so one compiled kernel serves every shape:
the extents are run-time arguments.

    >>> IndexSpec("take", "f32").kind
    'take'
    >>> extents((2, 5, 3), 1)
    (2, 3)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .spec import DTYPES, KernelError

KINDS = ("take", "scatterAdd", "sliceScatter", "cumsum")


@dataclass(frozen=True)
class IndexSpec:
    """kind: one of KINDS; dtype: the values' IR dtype (f32 f64 i32 bool; scatterAdd and
    cumsum add, so not bool); reverse: cumsum from the end of the axis."""

    kind: str
    dtype: str
    reverse: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise KernelError(
                f"unknown index kernel {self.kind!r}; expected one of {', '.join(KINDS)}"
            )
        if self.dtype not in DTYPES:
            raise KernelError(f"{self.kind}: unknown dtype {self.dtype!r}")
        if self.kind in ("scatterAdd", "cumsum") and self.dtype == "bool":
            raise KernelError(f"{self.kind}: cannot add bool values")
        if self.reverse and self.kind != "cumsum":
            raise KernelError(f"{self.kind}: only cumsum runs in reverse")

    @property
    def name(self) -> str:
        return f"{self.kind}{'_reverse' if self.reverse else ''}_{self.dtype}"


@dataclass(frozen=True)
class IndexExtents:
    """The sizes of one call. outer, inner: the blocks around the axis; n: the source's axis
    (take: the number of ids; scatterAdd, sliceScatter: g's axis; cumsum: the scanned axis);
    size: the other array's axis (take: x's; scatterAdd, sliceScatter: the result's; cumsum:
    n); first, step: sliceScatter's positions."""

    outer: int
    n: int
    size: int
    inner: int
    first: int = 0
    step: int = 1

    def rows(self, kind: str) -> int:
        """How many independent units a call splits over threads: output rows (take: outer*n,
        scatterAdd and sliceScatter: outer*size) or, for cumsum, lines (outer*inner)."""
        return self.outer * {"take": self.n, "cumsum": self.inner}.get(kind, self.size)

    def work(self, kind: str) -> int:
        """Elements written (scatterAdd: and read): what decides whether a call is worth threads."""
        rows = {"take": self.n, "cumsum": self.n, "sliceScatter": self.size}.get(
            kind, max(self.n, self.size)
        )
        return self.outer * rows * self.inner


def extents(shape, axis: int) -> tuple[int, int]:
    """(outer, inner) of a C-contiguous array of `shape` around `axis`."""
    return math.prod(shape[:axis]), math.prod(shape[axis + 1 :])
