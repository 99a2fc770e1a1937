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
    llvmlite releases the GIL, so a plan's new kernels build at once. Results in order, the
    first failure raised; the object code is the same whatever the thread count
    (tests/test_parallel_kernels.py). The helpers are bare threads that claim builds by index:
    the caller never waits for one to start (a warm process, whose builds are disk loads, is
    done before they run), and no executor module is imported."""
    import _thread

    from .cpu_count import usable_cpus

    n = len(builds)
    workers = min(usable_cpus(), n) - 1
    if workers < 1:
        return [b() for b in builds]
    results: list = [None] * n
    claimed = iter(range(n))  # next() on a range iterator is atomic under the GIL
    finished = threading.Semaphore(0)

    def work():
        for i in claimed:
            try:
                results[i] = (True, builds[i]())
            except BaseException as e:  # raised again by the caller, in order
                results[i] = (False, e)
            finished.release()

    for _ in range(workers):
        _thread.start_new_thread(work, ())
    work()
    for _ in range(n):
        finished.acquire()
    for ok, value in results:
        if not ok:
            raise value
    return [value for _, value in results]
