"""Loop layouts: the iteration space of a kernel after dropping size-1 dims and merging dims
that every input walks contiguously, so that kernels are as flat as the data allows.

The generated code depends only on a layout's *pattern* (rank, group sizes, which strides are
0 or 1); the dims and the other strides are read at run time from an int64 array, so one
compiled kernel serves every shape with the same pattern.

    >>> lay = elementwise_layout((4, 8), [None, (0, 1)])   # x + row vector
    >>> lay.dims, lay.strides
    ((4, 8), ((8, 1), (0, 1)))
    >>> elementwise_layout((4, 8), [None, None]).dims      # both contiguous: one flat loop
    (32,)
"""

from __future__ import annotations

import math

import numpy as np

from ...records import dataclass
from .kernel_spec import KernelSpec, ReduceSpec, c_strides


@dataclass(frozen=True)
class LoopLayout:
    """dims in loop order; strides[k][d] = element stride of input k along loop dim d.
    groups: sizes of consecutive dim groups (elementwise: one group; reduce: K1, R, K2)."""

    dims: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]
    groups: tuple[int, ...]

    def pattern(self) -> tuple:
        """What the generated code depends on: a stride is 0, 1, or read at run time."""
        cls = lambda s: s if s in (0, 1) else None
        return (self.groups, tuple(tuple(cls(s) for s in st) for st in self.strides))

    def dims_array(self) -> np.ndarray:
        """The run-time array [dims..., strides of input 0..., strides of input 1..., ...]."""
        flat = list(self.dims) + [s for st in self.strides for s in st]
        return np.array(flat or [0], dtype=np.int64)

    def dim_index(self, d: int) -> int:
        return d

    def stride_index(self, k: int, d: int) -> int:
        return len(self.dims) * (1 + k) + d


def _merge(dims: list[int], strides: list[list[int]], out_strides: list[int] | None):
    """Drop size-1 dims; merge d, d+1 where every input (and the output) is contiguous across."""
    keep = [d for d in range(len(dims)) if dims[d] != 1]
    dims = [dims[d] for d in keep]
    strides = [[st[d] for d in keep] for st in strides]
    outs = [out_strides[d] for d in keep] if out_strides is not None else None
    d = len(dims) - 2
    while d >= 0:
        inner = dims[d + 1]
        ok = all(st[d] == st[d + 1] * inner for st in strides)
        ok = ok and (outs is None or outs[d] == outs[d + 1] * inner)
        if ok:
            dims[d] *= inner
            del dims[d + 1]
            for st in strides:  # the merged dim steps like the inner one
                st[d] = st.pop(d + 1)
            if outs is not None:
                outs[d] = outs.pop(d + 1)
        d -= 1
    return dims, strides


def elementwise_layout(shape, strides) -> LoopLayout:
    """Layout of an elementwise kernel; `strides` per input (None = contiguous with shape)."""
    shape = tuple(shape)
    full = [list(c_strides(shape) if s is None else s) for s in strides]
    dims, st = _merge(list(shape), full, None)
    if not dims:  # a scalar (or all-ones) shape: one element
        dims, st = [1], [[0] for _ in full]
    return LoopLayout(tuple(dims), tuple(tuple(s) for s in st), (len(dims),))


def spec_layout(spec) -> LoopLayout:
    if isinstance(spec, KernelSpec):
        return elementwise_layout(spec.shape, [i.strides for i in spec.inputs])
    return reduce_layout(spec)


def reduce_layout(spec: ReduceSpec) -> LoopLayout:
    """Loop order K1 R K2: K2 = kept axes after the last reduced axis (the vectorized inner
    loop when non-empty), R = reduced axes, K1 = the other kept axes. The output, contiguous
    over the kept axes in order, is then contiguous over K1 x K2."""
    shape, axes = spec.shape, set(spec.axes)
    last = max(axes) if axes else -1
    k1 = [d for d in range(len(shape)) if d not in axes and d < last]
    r = sorted(axes)
    k2 = [d for d in range(len(shape)) if d > last]
    if not r:  # no reduced axis: everything is kept, reduce over one element
        k1, k2 = [], list(range(len(shape)))
    full = [inp.resolved_strides(shape) for inp in spec.inputs]
    out_c = dict(zip(k1 + k2, c_strides(tuple(shape[d] for d in k1 + k2))))
    groups_dims, groups_strides = [], []
    for group in (k1, r, k2):
        dims, st = _merge(
            [shape[d] for d in group],
            [[s[d] for d in group] for s in full],
            [out_c[d] for d in group] if group is not r else None,
        )
        groups_dims.append(dims)
        groups_strides.append(st)
    if not groups_dims[0] and not groups_dims[2]:
        groups_dims[0] = [1]  # one output element: K1 = (1,)
        groups_strides[0] = [[0] for _ in full]
    if not groups_dims[1]:
        groups_dims[1] = [1]
        groups_strides[1] = [[0] for _ in full]
    dims = tuple(d for g in groups_dims for d in g)
    strides = tuple(tuple(s for g in groups_strides for s in g[k]) for k in range(len(full)))
    return LoopLayout(dims, strides, tuple(len(g) for g in groups_dims))


def group_size(layout: LoopLayout, g: int) -> int:
    start = sum(layout.groups[:g])
    return math.prod(layout.dims[start : start + layout.groups[g]])
