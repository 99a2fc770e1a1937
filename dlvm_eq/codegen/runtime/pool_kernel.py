"""A compiled PoolSpec on the CPU: `PoolKernel` ((n, c) planes split over threads) and
`compile_pool` (one kernel per equal spec).

    >>> k = compile_pool(pool_spec("maxPool2d", attrs, (28, 28), "f32"))
    >>> k.run(y, [x])                  # C-contiguous (N, C, ., .) arrays of the spec's dtype

ABI of the compiled function (cpu/pool_ir.py): void k(i64 p0, i64 p1, ptr out, ptr in_0, ptr in_1).

Shared state (threads): `_kernels` (compile_pool's memo, a kernel_memo.KernelMemo: a race builds an equal
kernel twice, the last is kept); a PoolKernel is immutable after construction but for its
`_chunks` (plane ranges per plane count, filled on first use: a race computes one list twice,
both equal). A plane is always computed whole by one call, so results do not depend on how
planes are split.
"""

from __future__ import annotations

import ctypes

from ..kernels.pool_spec import PoolSpec
from .buffers import data_ptr
from .cpu_count import usable_cpus
from .jit import JIT
from .kernel_memo import KernelMemo
from .threads import CHUNKS_PER_THREAD, MIN_PARALLEL_WORK, run_ranges, split_range


def _pool_ir(spec: PoolSpec):
    from ..cpu.pool_ir import pool_ir  # the IR builders load on a cache miss only

    return pool_ir(spec)


class PoolKernel:
    """A compiled PoolSpec; `run(out, ins)` on C-contiguous arrays whose planes match the spec."""

    def __init__(self, spec: PoolSpec, threads: int | None = None):
        self.spec = spec
        self.threads = threads or usable_cpus()
        self.code = JIT.kernel("pool", spec, lambda: _pool_ir(spec))
        self.fn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, *([ctypes.c_void_p] * 3))(
            self.code.address
        )
        out_n, in_n = spec.plane_sizes()
        kh, kw = spec.kernel
        # work per plane: every input and output element once, every tap of every window once
        self._plane_work = out_n + sum(in_n) + spec.out_hw[0] * spec.out_hw[1] * kh * kw
        self._chunks: dict[int, list] = {}

    def chunks(self, planes: int) -> list[tuple[int, int]]:
        got = self._chunks.get(planes)
        if got is None:
            parts = max(
                1,
                min(
                    CHUNKS_PER_THREAD * self.threads,
                    planes * self._plane_work // MIN_PARALLEL_WORK,
                    planes,
                ),
            )
            got = self._chunks[planes] = split_range(planes, parts, 1) if planes else []
        return got

    def run(self, out, ins) -> None:
        planes = out.shape[0] * out.shape[1]
        chunks = self.chunks(planes)
        if not chunks:
            return
        ptrs = [data_ptr(out)] + [data_ptr(a) for a in ins]
        ptrs += ptrs[-1:] * (3 - len(ptrs))  # one-operand ops ignore in_1
        if len(chunks) == 1:
            self.fn(0, planes, *ptrs)
            return
        run_ranges(self.fn, chunks, tuple(ptrs), self.threads)


_kernels = KernelMemo()


def compile_pool(spec: PoolSpec) -> PoolKernel:
    return _kernels.get(spec, lambda: PoolKernel(spec))
