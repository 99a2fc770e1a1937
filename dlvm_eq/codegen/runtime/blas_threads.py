"""OpenBLAS's parallel jobs on our native worker pool, not on OpenBLAS's own threads.

    >>> install(native_pool())     # True: numpy's threaded BLAS calls now run on the pool
    >>> uninstall()                # OpenBLAS's own threads again

Why: OpenBLAS's workers busy-wait for ~100 ms after each threaded call (gemm_runtime.py's
docstring), on the core where our pool's helper must run the kernel that follows; a program
that mixes products and kernels pays for two pools fighting over two cores. OpenBLAS 0.3.27
and later take a "threads callback" (`openblas_set_threads_callback_function`): every
parallel section is handed to it as `numjobs` jobs. Ours (native_pool's `{symbol}_blas`, no
Python, no GIL) runs them on the pool's workers and the caller, or, when the pool is busy or
has too few workers, on threads made for that call (the jobs of a level-3 call wait for each
other, so each must have a thread of its own). Results are the same: the jobs and their
partition are OpenBLAS's; only the threads that run them change.

Which OpenBLAS: every one loaded in the process (/proc/self/maps) whose thread count fits the
pool (OpenBLAS splits into as many jobs as it has threads). A library without the callback
(older than 0.3.27, or not OpenBLAS) is left alone. After fork the child uninstalls it: the
child has no workers, and OpenBLAS starts threads of its own there.

Fork. OpenBLAS's own prefork handler (`blas_thread_shutdown_`) wakes its server threads with
a -1 in their queue word and joins them; a job of ours running meanwhile (OpenBLAS's
`exec_threads` zeroes the queue word of the thread number it is given) erased the -1, and the
fork waited forever in `pthread_join`. Every threaded call comes through our callback, which
holds the pool's BLAS mutex: a before-fork hook takes that mutex (waiting for the call in
flight, holding off the next) and the parent releases it after the fork. The child is
another matter, and OpenBLAS's: a thread of the parent inside a product at the fork (between
its jobs and its return, or waiting for the mutex) holds OpenBLAS's level-3 lock, which the
child inherits locked, so the child's first threaded product waits forever. Plain numpy does
the same, with or without our callback; OPENBLAS_NUM_THREADS=1 (no level-3 lock taken)
avoids it (README, Settings).

Module state: `_INSTALLED` (the callback setters of the libraries whose callback is ours) and
`_POOL` (the pool they call) are written under `_LOCK` or in the fork child.
"""

from __future__ import annotations

import ctypes
import os
import threading

_SETTERS = (
    "scipy_openblas_set_threads_callback_function64_",
    "scipy_openblas_set_threads_callback_function",
    "openblas_set_threads_callback_function64_",
    "openblas_set_threads_callback_function",
)
_THREAD_COUNTS = (
    "scipy_openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads",
    "openblas_get_num_threads64_",
    "openblas_get_num_threads",
)

_LOCK = threading.Lock()
_INSTALLED: list = []  # each library's openblas_set_threads_callback_function
_POOL = None  # the pool our callback runs on, while installed
_HELD = None  # the pool whose BLAS mutex this process holds across a fork


def loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process."""
    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(" ", 1)[-1].strip()
                name = os.path.basename(path)
                if "openblas" in name.lower() and ".so" in name and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


def _function(lib: ctypes.CDLL, names):
    for name in names:
        try:
            return getattr(lib, name)
        except AttributeError:
            continue
    return None


def install(pool) -> bool:
    """Route the threaded calls of every loaded OpenBLAS that fits `pool` to it; True if any."""
    global _POOL
    if pool is None:
        return False
    import numpy  # noqa: F401  (numpy loads its OpenBLAS)

    with _LOCK:
        if _INSTALLED:
            return True
        callback = None
        for path in loaded_openblas():
            try:
                lib = ctypes.CDLL(path)  # already loaded: the same handle
            except OSError:
                continue
            setter, count = _function(lib, _SETTERS), _function(lib, _THREAD_COUNTS)
            if setter is None or count is None:
                continue
            count.restype = ctypes.c_int
            if count() > pool.workers + 1:  # more jobs per call than the pool has threads
                continue
            if callback is None:
                callback = pool.blas_callback()
            setter.argtypes = [ctypes.c_void_p]
            setter.restype = None
            setter(callback)
            _INSTALLED.append(setter)
        if _INSTALLED:
            _POOL = pool
        return bool(_INSTALLED)


def uninstall() -> None:
    """OpenBLAS's own threads again, for every library `install` changed."""
    with _LOCK:
        _clear()


def installed() -> bool:
    return bool(_INSTALLED)


def _clear() -> None:
    global _POOL
    while _INSTALLED:
        _INSTALLED.pop()(None)
    _POOL = None


def _before_fork() -> None:
    """No OpenBLAS job of ours runs while the fork's handlers do (see the docstring)."""
    global _HELD
    pool = _POOL
    if pool is not None and _INSTALLED:
        pool.hold_blas(True)  # ctypes releases the GIL: the call in flight finishes
        _HELD = pool


def _after_fork_in_parent() -> None:
    global _HELD
    if _HELD is not None:
        _HELD.hold_blas(False)
        _HELD = None


def _after_fork_in_child() -> None:
    global _LOCK, _HELD
    _LOCK = threading.Lock()  # perhaps held at the fork
    _HELD = None  # the child's copy of the mutex goes with the pool it resets
    _clear()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
