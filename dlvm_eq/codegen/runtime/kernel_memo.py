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
