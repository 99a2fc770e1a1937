"""Launch plans of our GEMM kept for reuse, each run by one call at a time.

    >>> launch = pool.take(key, make)    # an idle plan for `key`, or make() a new one
    >>> launch(...)                       # no lock held: other threads run theirs meanwhile
    >>> pool.give(key, launch)            # idle again

A plan holds scratch (packed A and B) and argument blocks that its run writes, so two threads
must never run one plan at once. A single lock held over the whole product (what CpuGemm did)
serialized every concurrent caller of a micro-tile shape, different shapes included; here
the lock covers the lookup only, and a thread that finds no idle plan for its key (another
thread is running it) makes a plan of its own. At most `limit` idle plans are kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable


class LaunchPool:
    def __init__(self, limit: int):
        self.limit = limit
        self._idle: dict[Hashable, list] = {}
        self._count = 0  # idle plans in all
        self._lock = threading.Lock()

    def take(self, key: Hashable, make: Callable[[], Callable]) -> Callable:
        with self._lock:
            free = self._idle.get(key)
            if free:
                self._count -= 1
                return free.pop()
        return make()  # outside the lock: making one allocates its scratch

    def give(self, key: Hashable, launch: Callable) -> None:
        with self._lock:
            if self._count >= self.limit:
                self._idle.clear()
                self._count = 0
            self._idle.setdefault(key, []).append(launch)
            self._count += 1

    def idle(self) -> list[Callable]:
        """The idle plans (for tests)."""
        with self._lock:
            return [launch for free in self._idle.values() for launch in free]
