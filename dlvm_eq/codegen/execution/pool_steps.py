"""Pooling steps of a kernel plan on compiled kernels (kernels/pool_spec.py) instead of
window_ops' array algorithms: `pool_run` is window_run's branch for the pooling ops.

    run = pool_run(step, np, view_fns)      # np: CPU kernels; CuPy: GPU kernels
    run(env)

The kernel is chosen on the first run, by the output's dtype (the step does not carry it);
where pool_spec builds none (rows too long, a dtype without a kernel) the step runs
window_ops' algorithm as before. Shared state (threads): `kernels` of one step is a dict
filled on first use; two threads racing there may both build a kernel, both valid.
"""

from __future__ import annotations

from ...ir import window_ops
from ..kernels.spec import KernelError

_NO_KERNEL = object()


def _kernel(op: str, attrs: dict, hw, dtype: str, gpu: bool):
    from ..kernels.pool_spec import pool_spec  # LLVM loads only when a pool step runs

    try:
        spec = pool_spec(op, attrs, hw, dtype)
    except KernelError:
        return _NO_KERNEL
    if gpu:
        from ..gpu.pool_gpu import GpuPoolKernel

        return GpuPoolKernel(spec)
    from ..runtime.pool_kernel import compile_pool

    return compile_pool(spec)


def pool_run(step, xp, view_fns):
    """run(env) for a pooling WindowStep through a compiled kernel (numpy: the CPU's; another
    array module, CuPy: the GPU's), window_ops' algorithm where no kernel is built."""
    gpu = xp.__name__ != "numpy"
    op, out = step.op, step.out
    attrs = window_ops.unpack(op, step.packed)
    hw = attrs["size"] if op == "avgPool2dBackward" else step.inputs[0].shape[2:]
    slots = [v.slot for v in step.inputs]
    fns = [f or (lambda a: a) for f in view_fns]
    kernels: dict = {}

    def run(env):
        y = env[out]
        args = [xp.ascontiguousarray(f(env[s])) for f, s in zip(fns, slots)]
        k = kernels.get(y.dtype)
        if k is None:
            dtype = {"float32": "f32", "float64": "f64"}.get(y.dtype.name, "")
            k = kernels[y.dtype] = _kernel(op, attrs, hw, dtype, gpu)
        if k is _NO_KERNEL or any(a.dtype != y.dtype for a in args):
            xp.copyto(y, window_ops.evaluate(op, xp, args, attrs))
            return
        k.run(y, args)

    return run
