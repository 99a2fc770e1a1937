"""Faulting in a fresh buffer's pages ahead of its first use, on a helper thread.

    >>> done = populate_in_background([arena])   # returns at once; done.wait() to join
    >>> populated(arena)                       # True once every page is resident

Why: a program's first call writes its arena (and outputs) for the first time, and each fresh
page costs the writing thread a fault and the kernel's zeroing of it: on this project's
machines (virtual machines whose guest memory is backed on first touch) 4-60 ms for the CNN's
49 MB arena, 20-200 ms of system time in all for its first step, against none in a steady
step. `madvise(MADV_POPULATE_WRITE)` (Linux 5.14) faults the pages in as writable without
writing them, in one system call that holds no GIL: a helper thread runs it while the caller
loads kernels and starts the call, so the zeroing happens on another core. Because nothing is
written, it is safe while the caller already writes the same buffer (a page written first by
the caller is left as it is). Where the call is not available (another OS, an older kernel,
EINVAL) nothing is done and the pages fault in on first use, as before.

Shared state (threads): `_madvise` is looked up once under `_lock`; each helper owns a
reference to its buffer until it finishes.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading

import numpy as np

MADV_POPULATE_WRITE = 23  # linux/mman.h
PAGE = mmap.PAGESIZE
MIN_BYTES = 1 << 20  # below this a helper thread's start costs about what the faults do

_lock = threading.Lock()
_madvise = None  # libc's madvise, or False where there is none


def _libc_madvise():
    global _madvise
    with _lock:
        if _madvise is None:
            _madvise = False
            if sys.platform.startswith("linux"):
                fn = ctypes.CDLL(None, use_errno=True).madvise  # CDLL: the call drops the GIL
                fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
                fn.restype = ctypes.c_int
                _madvise = fn
        return _madvise


def _page_range(a: np.ndarray) -> tuple[int, int]:
    """(start, length) of the whole pages `a`'s memory lies in."""
    addr = a.__array_interface__["data"][0]
    start = addr - addr % PAGE
    end = addr + a.nbytes
    return start, -(-(end - start) // PAGE) * PAGE


def populate(a: np.ndarray) -> bool:
    """Fault in every page of `a` (C-contiguous) as writable, writing nothing. False where
    the system cannot (the pages then fault in on first use)."""
    fn = _libc_madvise()
    if not fn or not a.flags.c_contiguous or a.nbytes == 0:
        return False
    start, length = _page_range(a)
    return fn(start, length, MADV_POPULATE_WRITE) == 0


def populate_in_background(arrays: list[np.ndarray]) -> threading.Event:
    """Start `populate` of each array, in order, on one new helper thread; the event is set
    when it has finished (whatever the outcome). The caller may use the arrays meanwhile."""
    done = threading.Event()
    todo = list(arrays)  # the helper's own references: the buffers outlive its work

    def work():
        try:
            for a in todo:
                populate(a)
        finally:
            done.set()

    import _thread  # a bare thread: no executor module, started in ~50 us

    _thread.start_new_thread(work, ())
    return done


def populated(a: np.ndarray) -> bool:
    """Whether every page of `a` is resident (mincore), for tests; False where unknown."""
    if not sys.platform.startswith("linux") or a.nbytes == 0:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    start, length = _page_range(a)
    vec = np.zeros(length // PAGE, np.uint8)
    if libc.mincore(start, length, vec.ctypes.data) != 0:
        return False
    return bool(np.all(vec & 1))


__all__ = ["MIN_BYTES", "populate", "populate_in_background", "populated"]
