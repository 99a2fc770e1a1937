"""Pooling steps of a kernel plan on compiled kernels (kernels/pool_spec.py) instead of
window_ops' array algorithms: `pool_run` is window_run's branch for the pooling ops.

    run = pool_run(step, np, view_fns)      # None: no kernel for this target
    run(env)

The kernel is chosen on the first run, by the output's dtype (the step does not carry it);
where pool_spec builds none (rows too long, a dtype without a kernel) the step runs
window_ops' algorithm as before. Shared state (threads): `kernels` of one step is a dict
filled on first use; two threads racing there both get the same memoized kernel.
"""
from __future__ import annotations

from ...ir import window_ops
from ..kernels.spec import KernelError

_NO_KERNEL = object()


def _cpu_kernel(op: str, attrs: dict, hw, dtype: str):
    from ..kernels.pool_spec import pool_spec
    from ..runtime.pool_kernel import compile_pool   # LLVM loads only when a pool step runs
    try:
        return compile_pool(pool_spec(op, attrs, hw, dtype))
    except KernelError:
        return _NO_KERNEL


def pool_run(step, xp, view_fns):
    """run(env) for a pooling WindowStep through a compiled kernel, or None where this target
    has none (the caller then runs window_ops' algorithm)."""
    if xp.__name__ != "numpy":
        return None
    import numpy as np
    op, out = step.op, step.out
    attrs = window_ops.unpack(op, step.packed)
    hw = attrs["size"] if op == "avgPool2dBackward" else step.inputs[0].shape[2:]
    slots = [v.slot for v in step.inputs]
    fns = [f or (lambda a: a) for f in view_fns]
    kernels: dict = {}

    def run(env):
        y = env[out]
        args = [np.ascontiguousarray(f(env[s])) for f, s in zip(fns, slots)]
        k = kernels.get(y.dtype)
        if k is None:
            k = kernels[y.dtype] = _cpu_kernel(op, attrs, hw, {"float32": "f32", "float64": "f64"}.get(y.dtype.name, ""))
        if k is _NO_KERNEL or any(a.dtype != y.dtype for a in args):
            np.copyto(y, window_ops.evaluate(op, np, args, attrs))
            return
        k.run(y, args)
    return run
