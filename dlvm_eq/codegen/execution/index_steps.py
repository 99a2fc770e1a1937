"""Gathers, scatters and scans of a CPU plan as compiled kernels (runtime/index_kernel.py)
instead of numpy calls: `native_index_run(step, slots)` is the step's run(env).

An out-of-range index is the interpreter's error, with its message (ir/ops.checked_indices):
the kernel never follows such an index and reports it, and the same check as the
interpreter's then names the first one. A source seen through a view that is not its
buffer's C order is copied to C order first (the kernels read (outer, axis, inner) blocks).

    >>> run = native_index_run(step, plan.slots)      # an IndexStep, SliceScatterStep or ScanStep
    >>> run(env)
"""

from __future__ import annotations

import numpy as np

from ...ir.ops import checked_indices
from ..kernels.index_spec import IndexExtents, IndexSpec, extents
from ..planning.gather import IndexStep, SliceScatterStep
from ..planning.scan import ScanStep
from ..planning.views import apply_chain
from ..runtime.index_kernel import compile_index


def _reader(view):
    """env -> the view's array, C-contiguous (a view's reshape of a contiguous slot is free)."""
    slot, chain, shape = view.slot, view.chain, tuple(view.shape)
    if not chain:
        return lambda env: env[slot]
    if all(link[0] == "reshape" for link in chain):
        return lambda env: env[slot].reshape(shape)
    return lambda env: np.ascontiguousarray(apply_chain(env[slot], chain, np))


def native_index_run(step, slots):
    """The step's run(env) through a compiled kernel; None for a step of another kind."""
    if not isinstance(step, (IndexStep, SliceScatterStep, ScanStep)):
        return None
    src, o = _reader(step.src), step.out
    dtype = slots[o].dtype
    out_shape = tuple(slots[o].shape)
    if isinstance(step, ScanStep):
        kernel = compile_index(IndexSpec("cumsum", dtype, step.reverse))
        outer, inner = extents(out_shape, step.axis)
        n = out_shape[step.axis]
        ext = IndexExtents(outer, n, n, inner)
        return lambda env: kernel.run(env[o], src(env), None, ext)
    if isinstance(step, SliceScatterStep):
        kernel = compile_index(IndexSpec("sliceScatter", dtype))
        outer, inner = extents(out_shape, step.axis)
        ext = IndexExtents(
            outer, step.src.shape[step.axis], out_shape[step.axis], inner, step.lo, step.step
        )
        return lambda env: kernel.run(env[o], src(env), None, ext)
    kernel = compile_index(IndexSpec(step.op, dtype))
    ids = _reader(step.ids)
    n_ids = step.ids.shape[0]  # a vector of i32 (ir/ops._index_operand)
    outer, inner = extents(tuple(step.src.shape), step.axis)
    ext = IndexExtents(outer, n_ids, step.size, inner)
    op, size = step.op, step.size

    def run(env):
        i = ids(env)
        if kernel.run(env[o], src(env), i, ext) or ext.rows(op) == 0:
            checked_indices(op, i, size)  # raises the interpreter's error for a bad index

    return run
