"""The convolution and pooling steps of a kernel plan (planning/window.py) run: im2col into GEMM.

Strategy (measured in BENCHMARKS.md / the report of issue 14): the im2col matrix of an NCHW
input is a strided view of the padded input, (N, C, KH, KW, OH, OW); one contiguous copy
materializes it grouped as (groups, C/g * KH * KW, N * OH * OW), and the product with the
(O/g, C/g * KH * KW) weights is one GEMM per group (our GEMM where `gemm_runtime` takes the
product, else numpy's BLAS; CuPy/cuBLAS on the GPU), then a layout copy to NCHW. The input
adjoint is the transposed product followed by col2im (KH * KW strided adds), the weight adjoint
im2col(x)ᵀ-style products. Pools read the same window view of the input (ir/window_ops.py
holds the array algorithms, written against numpy or CuPy). On the CPU the three convolution
ops instead run runtime/conv_cpu.py (generated im2col/col2im kernels, its own product plan).

    run = window_run(step, np, view_fns)      # np: the CPU; CuPy: the GPU
    run(env)
"""

from __future__ import annotations

from ...ir import window_ops
from ..planning.window import WindowStep
from .pool_steps import pool_run


def _cpu_matmul():
    """out = a @ b through our GEMM where it takes the product, else numpy's BLAS."""
    import numpy as np

    from ..runtime.gemm_runtime import matmul as gemm

    def matmul(a, b, out):
        if not gemm(a, b, out):
            np.matmul(a, b, out=out)

    return matmul


def window_run(step: WindowStep, xp, view_fns):
    """The step as a function of the plan's environment (a list of arrays indexed by slot);
    view_fns[i] applies input i's view chain (None: the array as it is)."""
    from ..runtime import conv_cpu  # loads with a plan's first window step, not with the executor

    if step.op in window_ops.POOL_OPS:  # compiled pooling kernels where the target has them
        run = pool_run(step, xp, view_fns)
        if run is not None:
            return run
    attrs = window_ops.unpack(step.op, step.packed)
    op, out = step.op, step.out
    slots = [v.slot for v in step.inputs]
    fns = [f or (lambda a: a) for f in view_fns]
    matmul = _cpu_matmul() if xp.__name__ == "numpy" else None
    if matmul is not None and op in conv_cpu.OPS:
        return _conv_run(op, attrs, slots, fns, out, matmul)

    def run(env):
        args = [f(env[s]) for f, s in zip(fns, slots)]
        xp.copyto(env[out], window_ops.evaluate(op, xp, args, attrs, matmul))

    return run


def conv_kernel_builds(plan) -> list:
    """A build (a callable) per im2col/col2im kernel the plan's convolutions run on the CPU,
    so that they compile with the plan's other kernels, in parallel and inside the compile's
    `kernels` phase, rather than on the first call."""
    if not any(isinstance(step, WindowStep) for step in plan.steps):
        return []  # the convolution runtime loads only for a plan that has window steps
    from ..runtime import conv_cpu
    from ..runtime.conv_kernel import compile_conv

    specs = {conv_cpu.kernel_spec(*call) for call in conv_calls(plan)}
    return [lambda spec=spec: compile_conv(spec) for spec in sorted(specs, key=repr)]


def conv_scratch(plan) -> list:
    """The scratch matrices the plan's convolutions will use on this thread (runtime/conv_cpu
    .reserve), allocated now and unwritten, for the executor to fault in ahead of the first
    call (the CNN's: 29 MB of columns, 29 MB of forward columns, 6.4 MB transposed)."""
    if not any(isinstance(step, WindowStep) for step in plan.steps):
        return []
    from ..runtime import conv_cpu

    return conv_cpu.reserve(conv_calls(plan))


def conv_calls(plan) -> list[tuple]:
    """(op, input shape, weight or dY shape, dtype, attributes) of each convolution step."""
    from ..kernels.spec import DTYPES
    from ..runtime import conv_cpu

    return [
        (
            step.op,
            step.inputs[0].shape,
            step.inputs[1].shape,
            DTYPES[plan.slots[step.out].dtype],
            window_ops.unpack(step.op, step.packed),
        )
        for step in plan.steps
        if isinstance(step, WindowStep) and step.op in conv_cpu.OPS
    ]


def _conv_run(op, attrs, slots, fns, out, matmul):
    """A convolution on the CPU: generated im2col/col2im kernels around the products
    (runtime/conv_cpu.py), written straight into the output slot."""
    import numpy as np

    from ..runtime import conv_cpu

    def run(env):
        args = [np.ascontiguousarray(f(env[s])) for f, s in zip(fns, slots)]
        dst = env[out]
        if dst.flags.c_contiguous:
            conv_cpu.evaluate(op, args, attrs, matmul, out=dst)
        else:
            np.copyto(dst, conv_cpu.evaluate(op, args, attrs, matmul))

    return run
