"""The fused attention kernel (gpu/attention_ptx.py) launched through CuPy, and the plan step
that runs it: `attention_gpu_run`.

    >>> spec = attention_spec(q.shape, k.shape, v.shape, bias.shape, 0.125, False, "f32")
    >>> GpuAttentionKernel(spec).run(out, lse, q, k, v, bias)   # C-contiguous CuPy arrays

PTX is made for the device's arch and kept where gpu_runtime keeps every kernel's (memory per
(spec, arch), disk per (IR, arch)). Shared state (threads): gpu_runtime's caches under its lock;
a step's kernels per shape in a dict (two threads may both load one; equal kernels).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import gpu_runtime
from .attention_ptx import AttentionGpuSpec, attention_ptx_ir
from .llvm_ptx import PtxKernel

DTYPE_NAMES = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def _attention_ir(spec: AttentionGpuSpec, arch: str) -> tuple:
    text, symbol = attention_ptx_ir(spec, arch)
    return text, symbol, None, 64, "attention"


def attention_ptx_for(spec: AttentionGpuSpec, arch: str) -> PtxKernel:
    """PTX for `spec` on `arch`, from memory, the disk cache, or the code generator."""
    return gpu_runtime.ptx_for(spec, arch, build=_attention_ir)


def bias_strides(bias_shape: tuple, scores: tuple) -> tuple[int, int, int, int]:
    """Element strides of a C-contiguous bias of `bias_shape` broadcast to `scores`
    (batch.. + (m, n), batch of 0 to 2 dims), over (B1, B2, m, n): 0 where it broadcasts."""
    shape = (1,) * (len(scores) - len(bias_shape)) + tuple(bias_shape)
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step if dim != 1 else 0)
        step *= dim
    full = [0] * (4 - len(strides)) + strides[::-1]
    return full[0], full[1], full[2], full[3]


def attention_spec(q_shape, k_shape, v_shape, bias_shape, scale, causal, dtype: str):
    """The launch's AttentionGpuSpec; None where the kernel does not apply (a zero-sized
    dimension, more than two batch dims)."""
    batch, (m, d), (n, e) = tuple(q_shape[:-2]), q_shape[-2:], v_shape[-2:]
    if len(batch) > 2 or 0 in (m, n, d, e, *batch):
        return None
    b2 = (1,) * (2 - len(batch)) + batch
    strides = bias_strides(tuple(bias_shape), batch + (m, n))
    return AttentionGpuSpec(dtype, (b2[0], b2[1]), m, n, d, e, float(scale), bool(causal), strides)


class GpuAttentionKernel:
    """An AttentionGpuSpec loaded on the current CUDA device: spec.grid() CTAs of
    spec.query_block threads."""

    def __init__(self, spec: AttentionGpuSpec):
        cp = gpu_runtime.cupy_module()
        dev = cp.cuda.Device()
        arch = gpu_runtime.arch_for(dev.compute_capability)
        self.spec = spec
        self._module, self._fn = gpu_runtime.load_function(
            cp, attention_ptx_for(spec, arch), arch, dev.id
        )

    def run(self, out, lse, q, k, v, bias, stream=None) -> None:
        self.run_with(out, lse, q, k, v, bias, stream=stream)

    def run_with(self, *arrays, stream=None) -> None:
        """The launch on the kernel's pointers, in its .entry's order (attention_ptx.py,
        attention_backward_ptx.py)."""
        kw = {} if stream is None else {"stream": stream}
        self._fn((self.spec.grid(),), (self.spec.query_block,), arrays, **kw)


def _scalar(kernels: dict, cp, value: float, dtype):
    """A constant bias as a 0-d device array, copied to the device once per step and dtype."""
    key = ("bias", np.dtype(dtype))
    if key not in kernels:
        kernels[key] = cp.asarray(np.full((), value, dtype))
    return kernels[key]


def attention_gpu_run(step, cp, view_fns, fallback):
    """A forward AttentionStep (codegen/planning/attention.py) as a function of the GPU plan's
    environment: the fused kernel, writing the step's log-sum-exp slot where it has one;
    `fallback(env)` (the reference formulas) for what the kernel does not cover."""
    fns = [f or (lambda a: a) for f in view_fns]
    slots = [v.slot for v in step.inputs]
    kernels: dict = {}

    def run(env):
        args = [cp.ascontiguousarray(f(env[s])) for f, s in zip(fns, slots)]
        q, k, v = args[:3]
        dtype = DTYPE_NAMES.get(np.dtype(q.dtype))
        bias = args[3] if len(args) == 4 else _scalar(kernels, cp, step.bias, q.dtype)
        key = (q.shape, k.shape, v.shape, bias.shape)
        if key not in kernels:
            spec = dtype and attention_spec(*key, step.scale, step.causal, dtype)
            kernels[key] = GpuAttentionKernel(spec) if spec else None
        kernel = kernels[key]
        if kernel is None:
            fallback(env)
            return
        out = env[step.out]
        lse = env[step.lse] if step.lse >= 0 else cp.empty(q.shape[:-1], q.dtype)
        kernel.run(out, lse, q, k, v, cp.ascontiguousarray(bias))

    return run


def _kernel_for(kernels: dict, key: tuple, make):
    if key not in kernels:
        spec = make()
        kernels[key] = GpuAttentionKernel(spec) if spec else None
    return kernels[key]


def attention_backward_gpu_run(step, cp, view_fns, fallback):
    """A backward AttentionStep (dQ, dK, dV of one attention) as a function of the GPU plan's
    environment: the "dq" kernel (dQ and D), then "dkv" (dK and dV); the row log-sum-exp from
    the forward step's slot, or from the forward kernel where the plan has none. Outputs the
    step does not want go to scratch arrays. `fallback(env)` where the kernels do not apply."""
    fns = [f or (lambda a: a) for f in view_fns]
    slots = [v.slot for v in step.inputs]
    kernels: dict = {}

    def run(env):
        args = [cp.ascontiguousarray(f(env[s])) for f, s in zip(fns, slots)]
        lse = args.pop() if step.lse >= 0 else None
        q, k, v = args[:3]
        o, g = args[-2:]
        bias = args[3] if len(args) == 6 else _scalar(kernels, cp, step.bias, q.dtype)
        dtype = DTYPE_NAMES.get(np.dtype(q.dtype))
        shapes = (q.shape, k.shape, v.shape, bias.shape)
        base = dtype and attention_spec(*shapes, step.scale, step.causal, dtype)
        if not base:
            fallback(env)
            return
        bias = cp.ascontiguousarray(bias)
        if lse is None:  # no forward step to read it from: the forward kernel computes it
            lse = cp.empty(q.shape[:-1], q.dtype)
            fwd = _kernel_for(kernels, ("forward", *shapes), lambda: base)
            fwd.run(cp.empty(q.shape[:-1] + v.shape[-1:], q.dtype), lse, q, k, v, bias)
        grads = [
            env[s] if s >= 0 else cp.empty(a.shape, a.dtype) for s, a in zip(step.grads, (q, k, v))
        ]
        delta = cp.empty(q.shape[:-1], q.dtype)
        dq = _kernel_for(kernels, ("dq", *shapes), lambda: dataclasses.replace(base, kernel="dq"))
        dq.run_with(grads[0], delta, q, k, v, bias, o, g, lse)
        dkv = _kernel_for(
            kernels, ("dkv", *shapes), lambda: dataclasses.replace(base, kernel="dkv")
        )
        dkv.run_with(grads[1], grads[2], q, k, v, bias, g, lse, delta)

    return run
