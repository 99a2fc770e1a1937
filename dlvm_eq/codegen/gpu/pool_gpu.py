"""Pooling kernels (gpu/pool_ptx.py) launched through CuPy: `GpuPoolKernel`.

    >>> k = GpuPoolKernel(spec)        # GpuUnavailable without CuPy or a working GPU
    >>> k.run(y, [x])                  # C-contiguous CuPy arrays (N, C, ., .)

PTX is made for the device's arch and kept where gpu_runtime keeps every kernel's (memory per
(spec, arch), disk per (IR, arch)); loading goes through gpu_runtime too. Shared state
(threads): gpu_runtime's caches under its lock; a GpuPoolKernel is immutable.
"""

from __future__ import annotations

import numpy as np

from ..kernels.pool_spec import PoolSpec
from . import gpu_runtime
from .llvm_ptx import PtxKernel
from .pool_ptx import items, pool_ptx_ir


def _pool_ir(spec: PoolSpec, arch: str) -> tuple:
    text, symbol = pool_ptx_ir(spec, arch)
    return text, symbol, None, 64, "pool"


def pool_ptx_for(spec: PoolSpec, arch: str) -> PtxKernel:
    """PTX for `spec` on `arch`, from memory, the disk cache, or the code generator."""
    return gpu_runtime.ptx_for(spec, arch, build=_pool_ir)


class GpuPoolKernel:
    """A PoolSpec loaded on the current CUDA device; one thread per item (pool_ptx.items)."""

    def __init__(self, spec: PoolSpec):
        cp = gpu_runtime.cupy_module()
        dev = cp.cuda.Device()
        arch = gpu_runtime.arch_for(dev.compute_capability)
        self.spec = spec
        self._module, self._fn = gpu_runtime.load_function(
            cp, pool_ptx_for(spec, arch), arch, dev.id
        )
        self._sms = dev.attributes.get("MultiProcessorCount", 80)

    def run(self, out, ins, stream=None) -> None:
        n = items(self.spec, out.shape[0] * out.shape[1])
        if not n:
            return
        ptrs = [out] + list(ins)
        ptrs += ptrs[-1:] * (3 - len(ptrs))  # one-operand ops ignore in_1
        grid = (max(1, min(-(-n // gpu_runtime.BLOCK), self._sms * gpu_runtime.BLOCKS_PER_SM)),)
        kw = {} if stream is None else {"stream": stream}
        self._fn(grid, (gpu_runtime.BLOCK,), (np.int64(n), *ptrs), **kw)
