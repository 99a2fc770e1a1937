"""`take`, `scatterAdd` and `sliceScatter` steps (planning/gather.py) run with an array module:
numpy, or CuPy on the GPU.

On the CPU these steps run as compiled kernels (execution/index_steps.py), which raise the
reference interpreter's DlvmError for an out-of-range index (ir/ops.checked_indices). Here
(the GPU's CuPy calls) every index is clamped into [0, size - 1] (numpy's mode="clip") so that
no launch reads or writes memory outside a buffer; the GPU program then raises the same error
after its steps, from one device-side check per call (execution/index_range_check.py).

    run = index_run(step, cupy, view_fn)
    run(env)
"""

from __future__ import annotations

from ..planning.gather import SliceScatterStep


def index_run(step, xp, view_fn):
    """env -> None running an IndexStep or SliceScatterStep with array module xp (numpy or
    CuPy); view_fn(chain, xp) turns a view chain into a function (the executor's)."""
    fs = view_fn(step.src.chain, xp) or (lambda a: a)
    if isinstance(step, SliceScatterStep):
        s, o = step.src.slot, step.out
        n = step.src.shape[step.axis]
        where = (slice(None),) * step.axis + (
            slice(step.lo, step.lo + (n - 1) * step.step + 1, step.step),
        )

        def run_slice_scatter(env):
            out = env[o]
            out.fill(0)
            out[where] = fs(env[s])

        return run_slice_scatter
    fi = view_fn(step.ids.chain, xp) or (lambda a: a)
    s, i, o, axis, top = step.src.slot, step.ids.slot, step.out, step.axis, step.size - 1
    if step.op == "take":

        def run_take(env):
            xp.take(fs(env[s]), xp.clip(fi(env[i]), 0, top), axis=axis, out=env[o])

        return run_take
    lead = (slice(None),) * axis

    def run_scatter_add(env):
        out = env[o]
        out.fill(0)
        xp.add.at(out, lead + (xp.clip(fi(env[i]), 0, top),), fs(env[s]))

    return run_scatter_add
