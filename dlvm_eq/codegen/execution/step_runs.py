"""Plan steps as closures on a call's slot list (`env`), shared by the CPU and GPU programs
(cpu_program.py, gpu_program.py): view chains as functions, aliases, row kernels, direct kernel
calls, batched products through our GEMM, and the steps the array library does itself.

    run = array_step(copy_step, np)   # run(env) copies env[src] (through its views) to env[out]
"""

from __future__ import annotations

import operator

import numpy as np

from ..planning.attention import AttentionStep, attention_run
from ..planning.plan import AliasStep, ConcatStep, CopyStep, WindowStep
from ..planning.views import apply_chain


def gemm_sized(out_shape, step) -> bool:
    """Whether a 2-D matmul is one for our GEMM (gemm_runtime.worth_our_gemm)."""
    from ..runtime.gemm_runtime import worth_our_gemm

    return (
        len(out_shape) == 2
        and len(step.a.shape) == 2
        and worth_our_gemm(out_shape[0], step.a.shape[1], out_shape[1])
    )


def batch_sized(out_shape, step) -> bool:
    """Whether a batched matmul is one for our GEMM's batch loop (batch_gemm.worth_batched)."""
    from ..runtime.batch_gemm import worth_batched

    return len(step.a.shape) >= 2 and worth_batched(tuple(out_shape), step.a.shape[-1])


def batched_matmul(a: int, b: int, o: int, fa, fb, fo=None):
    """The step running a batched product through our GEMM, numpy where its layouts do not
    suit; `fo` views the out slot (a result written in its reader's layout)."""
    from ..runtime.batch_gemm import batch_matmul

    fa, fb, fo = (f or (lambda x: x) for f in (fa, fb, fo))

    def run_batched(env):
        x, y, out = fa(env[a]), fb(env[b]), fo(env[o])
        if not batch_matmul(x, y, out):
            np.matmul(x, y, out=out)

    return run_batched


def view_fn(chain, xp):
    """A function applying a view chain to an array (identity for an empty chain)."""
    if not chain:
        return None
    if len(chain) == 1 and chain[0][0] == "transpose" and list(chain[0][1]) == [1, 0]:
        return lambda a: a.T
    if len(chain) == 1 and chain[0][0] == "reshape":
        shape = tuple(chain[0][1])
        return lambda a: a.reshape(shape)
    return lambda a: apply_chain(a, chain, xp)


def alias_view(a, step: AliasStep):
    """The source's memory from `offset` on, flat (a view on numpy and CuPy alike; sources are
    C-contiguous)."""
    return a.reshape(-1)[step.offset :]


def alias_run(step: AliasStep):
    """The step as a closure on the slot list (the GPU's; the CPU's keeps pointers too)."""
    src, out = step.src, step.out
    return lambda env: env.__setitem__(out, alias_view(env[src], step))


def row_run(kernel, step):
    """A row kernel (CPU RowKernel or GpuRowKernel: the same `run`) or a map-reduce kernel
    (MapReduceKernel: outputs, then reductions) as a closure on the slot list."""
    run = kernel.run
    ins, outs, reds = list(step.inputs), list(step.outputs), list(step.reductions)
    return lambda env: run([env[s] for s in ins], [env[s] for s in outs], [env[s] for s in reds])


def direct_call(fn, head: tuple, pointers: list[int], tail: int):
    """A kernel's call on this thread as a closure on the slot list: the leading integers,
    the data pointers at env[pointers], the dims array."""
    if len(pointers) == 1:
        p = pointers[0]
        return lambda env: fn(*head, env[p], tail)
    pick = operator.itemgetter(*pointers)
    return lambda env: fn(*head, *pick(env), tail)


def array_step(step, xp):
    """The run(env) of a step that the array library `xp` (numpy, or CuPy on the GPU) does
    itself: gathers and scatters, scans (the GPU's; the CPU compiles those: index_steps.py),
    windows (im2col + GEMM, pools), concatenations and copies; the same code on both targets."""
    if isinstance(step, WindowStep):
        from .window_steps import window_run  # the window runtimes load with a first window

        return window_run(step, xp, [view_fn(v.chain, xp) for v in step.inputs])
    if isinstance(step, AttentionStep):  # issue 33
        return attention_run(step, xp, [view_fn(v.chain, xp) for v in step.inputs])
    if isinstance(step, ConcatStep):
        parts = [(p.slot, view_fn(p.chain, xp) or (lambda x: x)) for p in step.parts]
        axis, o = step.axis, step.out
        return lambda env: xp.concatenate([f(env[s]) for s, f in parts], axis=axis, out=env[o])
    if isinstance(step, CopyStep):
        s, f, o = step.src.slot, view_fn(step.src.chain, xp) or (lambda x: x), step.out
        return lambda env: xp.copyto(env[o], f(env[s]))
    # gathers, scatters and scans: their step types and runs load with a plan that has one
    from ..planning.gather import IndexStep, SliceScatterStep
    from ..planning.scan import ScanStep, scan_run

    if isinstance(step, (IndexStep, SliceScatterStep)):
        from .gather_steps import index_run

        return index_run(step, xp, view_fn)
    assert isinstance(step, ScanStep), step
    return scan_run(step, xp, view_fn)


__all__ = [
    "alias_run",
    "alias_view",
    "array_step",
    "batch_sized",
    "batched_matmul",
    "direct_call",
    "gemm_sized",
    "row_run",
    "view_fn",
]
