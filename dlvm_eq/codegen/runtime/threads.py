"""Running a kernel's chunks on threads: the native pool (`native_pool`) or Python threads.

    >>> run_ranges(fn, split_range(n, parts), (out_ptr, in_ptr, dims_ptr), usable_cpus())

Parallel kernels run on the native pool, or on Python threads (`thread_pool`) with
DLVM_EQ_NATIVE_POOL=0; either way the caller takes chunks too and never waits for a helper
that has not claimed one. With one usable CPU (`cpu_count.usable_cpus`) every chunk runs on the
caller and no helper thread is started.

Shared state (threads): `_pool` (Python threads) is created once under `_pool_lock`; the
native pool is owned by `native_pool`.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING

from ...config import settings
from . import blas_threads, native_pool
from .cpu_count import usable_cpus

# Work (elements) below which a kernel runs on the calling thread: waking workers costs
# ~10-30 us, about what one core needs for this many elements of a typical fused kernel.
MIN_PARALLEL_WORK = 1 << 16
ALIGN = 64  # chunk boundaries in elements: whole cache lines per thread
CHUNKS_PER_THREAD = 16  # many more chunks than threads: a descheduled thread holds up little

if TYPE_CHECKING:  # the executor (and logging, which it imports) loads with a first use
    from concurrent.futures import ThreadPoolExecutor

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def thread_pool() -> ThreadPoolExecutor:
    """The persistent worker threads (one per usable CPU), created on first use."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                from concurrent.futures import ThreadPoolExecutor

                _pool = ThreadPoolExecutor(
                    max_workers=usable_cpus(), thread_name_prefix="dq-kernel"
                )
    return _pool


def native_workers():
    """The native worker pool, unless DLVM_EQ_NATIVE_POOL=0 (then Python threads are used)."""
    if not settings().native_pool:
        return None
    return native_pool.native_pool()


def rest_workers() -> None:
    """A compiled program call has returned: the native pool's idle workers go to sleep now
    rather than spin out their budget while the user's own code (numpy and its BLAS threads)
    runs. Costs the next call a futex wake; the caller starts its first kernel alone meanwhile.
    Not when OpenBLAS's jobs run on the pool too (DLVM_EQ_BLAS_POOL=1): the user's numpy then
    has no threads of its own to give the cores to, and the next call's first product would
    wait for the woken worker (OpenBLAS's jobs wait for each other)."""
    pool = native_pool.running_pool()
    if RESTING and pool is not None and not blas_threads.installed():
        pool.rest()


# Whether rest_workers acts: a switch for measuring (benchmarks/contention.py runs both ways).
RESTING = True


def run_chunks(fn, chunks: list[tuple], threads: int) -> None:
    """Run fn(*args) for every args in `chunks` on up to `threads` threads, the caller's
    included. Chunks are taken from a shared counter, so a thread that the OS descheduled does
    not hold up the others: there are more chunks than threads. The native pool's workers
    are used where available (they wake in well under a microsecond; Python's in 15-60 us)."""
    if len(chunks) == 1 or threads == 1:
        for args in chunks:
            fn(*args)
        return
    pool = native_workers()
    if pool is not None and len(chunks[0]) <= pool.max_args:
        pool.run(ctypes.cast(fn, ctypes.c_void_p).value, chunks, threads)
        return
    run_python(fn, chunks, threads)


def run_ranges(fn, ranges: list[tuple[int, int]], tail: tuple, threads: int) -> None:
    """run_chunks for calls fn(lo, hi, *tail), the kernels' usual shape."""
    if len(ranges) == 1 or threads == 1:
        for lo, hi in ranges:
            fn(lo, hi, *tail)
        return
    pool = native_workers()
    if pool is not None and 2 + len(tail) <= pool.max_args:
        pool.run_ranges(ctypes.cast(fn, ctypes.c_void_p).value, ranges, tail, threads)
        return
    run_python(fn, [(lo, hi, *tail) for lo, hi in ranges], threads)


def run_python(fn, chunks: list[tuple], threads: int) -> None:
    """run_chunks for a Python callable that releases the GIL (numpy's products), and the
    others' fallback: Python threads take chunks from one shared iterator (next() on it is
    atomic under the GIL); the caller works too, and waits only for helpers that started, not
    for queued ones."""
    if len(chunks) == 1 or threads == 1:
        for args in chunks:
            fn(*args)
        return
    todo = iter(chunks)

    def work():
        for args in todo:
            fn(*args)

    futures = [thread_pool().submit(work) for _ in range(min(threads, len(chunks)) - 1)]
    work()
    for f in futures:
        if not f.cancel():  # running (it may hold a chunk) or finished
            f.result()


def split_range(n: int, parts: int, align: int = ALIGN) -> list[tuple[int, int]]:
    step = -(-n // parts)
    step = -(-step // align) * align if step > align else step
    return [(lo, min(lo + step, n)) for lo in range(0, n, step)]
