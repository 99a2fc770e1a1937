"""One compiled kernel object per spec and process: the memo every kernel family's `compile_*`
shares (maps and reductions, row kernels, pools, convolutions' im2col/col2im, index kernels).

    _kernels = KernelMemo()
    def compile_pool(spec): return _kernels.get(spec, lambda: PoolKernel(spec))

Shared state (threads): the lock covers the lookup and the store, not the build, so a slow
compile never holds up callers of other kernels. Two threads asking for the same new kernel
may both build one (JIT.kernel compiles its code once); the last one stored is kept, and both
are valid.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TypeVar

K = TypeVar("K")


class KernelMemo:
    def __init__(self):
        self._items: dict = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], K]) -> K:
        with self._lock:
            k = self._items.get(key)
        if k is None:
            k = build()
            with self._lock:
                self._items[key] = k
        return k

    def __iter__(self):
        """The keys held now (a snapshot: tests see which kernels a program compiled)."""
        with self._lock:
            return iter(list(self._items))


def build_all(builds: list[Callable[[], K]]) -> list[K]:
    """[build() for build in builds], run on up to usable_cpus() threads, the caller building
    too: kernels compile in their threads' own LLVM contexts (cpu/llvm_cpu.compile_object) and
    llvmlite releases the GIL, so a plan's new kernels build at once. Results in order; the
    object code is the same whatever the thread count (tests/test_parallel_kernels.py)."""
    from concurrent.futures import ThreadPoolExecutor

    from .cpu_count import usable_cpus

    workers = min(usable_cpus(), len(builds)) - 1
    if workers < 1:
        return [b() for b in builds]
    with ThreadPoolExecutor(workers, thread_name_prefix="dlvm_eq-kernel-build") as pool:
        rest = [pool.submit(b) for b in builds[1:]]
        first = builds[0]()
        return [first] + [f.result() for f in rest]
