"""Out-of-range ids on the GPU are the interpreter's error, as on the CPU.

    >>> check = IndexRangeCheck(plan.steps, cp, view_fn)    # once per GpuProgram
    >>> check(env)        # after the call's steps: raises the interpreter's DlvmError, or returns

The GPU program's take and scatterAdd steps (execution/gather_steps.index_run, CuPy calls) clamp every
id into range, so that no launch reads or writes outside a buffer; left at that, an
out-of-range id would give a silently different result than the CPU's and the interpreter's
error (a miscompile). So after the steps have run, every such step's ids are compared with
their axis on the device and the flags are OR-ed there: one device-to-host read per call (only
in programs with take/scatterAdd) rather than one per step. When the flag is set, the steps'
ids are copied to the host in plan order and checked as the interpreter checks them
(ir/ops.checked_indices), which raises its error naming the first bad index.

Reading the ids after the steps is sound because every slot of a GPU program has a buffer of
its own for the whole call (GpuProgram allocates each temporary afresh; no arena reuse), and a
step writes only its own output.
"""

from __future__ import annotations

from ...ir.ops import checked_indices
from ..planning.gather import IndexStep


class IndexRangeCheck:
    def __init__(self, steps, xp, view_fn):
        self.xp = xp
        self.checks = [
            (s.op, s.ids.slot, view_fn(s.ids.chain, xp) or (lambda a: a), s.size)
            for s in steps
            if isinstance(s, IndexStep)
        ]

    def flag(self, env):
        """Whether any id is out of range, on the device (no read-back); None without ids
        (a gpu loop, gpu_loop.py, ORs the steps' flags and reads them once per loop)."""
        bad = None
        for _, slot, view, size in self.checks:
            ids = view(env[slot])
            flag = ((ids < 0) | (ids >= size)).any()  # on the device: no copy yet
            bad = flag if bad is None else bad | flag
        return bad

    def __call__(self, env) -> None:
        if not self.checks:
            return
        if not bool(self.flag(env)):  # the call's one read-back
            return
        for op, slot, view, size in self.checks:
            checked_indices(op, self.xp.asnumpy(view(env[slot])), size)
