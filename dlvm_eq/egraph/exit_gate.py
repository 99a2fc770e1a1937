"""Interpreter exit with a daemon thread inside egglog: the process must exit cleanly.

CPython 3.11 ends a daemon thread that takes the GIL back after finalization began with
`pthread_exit`, whose forced unwind through egglog's Rust frames aborts the process ("FATAL:
exception not rethrown"); and finalization drops each thread's e-graphs on the main thread,
which pyo3 refuses for an `unsendable` EGraph ("is being dropped on another thread"). So:

- every call into egglog runs inside `in_egglog()`, which counts the threads inside;
- at exit (atexit, after Python joined the non-daemon threads) the gate closes: a daemon
  thread that would enter egglog then parks (blocked in C, never in Rust), and the exit waits
  for the threads inside to come out (each call is bounded by its budget; WAIT_SECONDS at most);
- the e-graphs other threads own (`owned`) get one reference more, so finalization never
  drops them on the main thread: the process is ending, the OS takes their memory.

    with in_egglog():
        egraph.run_program(*commands)
"""

from __future__ import annotations

import atexit
import ctypes
import threading
import weakref
from contextlib import contextmanager

WAIT_SECONDS = 60.0  # at most this long at exit for the threads inside egglog

_cond = threading.Condition()
_inside = 0
_closed = False
_parked = threading.Lock()
_parked.acquire()  # never released: a daemon thread parked at exit waits on it for good
_owners: weakref.WeakSet = weakref.WeakSet()  # objects with .egraph and .thread (an ident)


def owned(owner) -> None:
    """Register an object holding an egglog EGraph (`owner.egraph`) made on the thread
    `owner.thread` (an ident): at exit it is kept from being dropped on another thread."""
    _owners.add(owner)


@contextmanager
def in_egglog():
    """Around a call into egglog: counted, so that the interpreter's exit waits for it; once
    the exit began, a thread other than the main one parks here instead of entering."""
    global _inside
    with _cond:
        parking = _closed and threading.current_thread() is not threading.main_thread()
        if not parking:
            _inside += 1
    if parking:
        _parked.acquire()  # blocks in C until the process is gone
        raise SystemExit  # (never reached: the lock is never released)
    try:
        yield
    finally:
        with _cond:
            _inside -= 1
            _cond.notify_all()


def _at_exit() -> None:
    global _closed
    with _cond:
        _closed = True
        _cond.wait_for(lambda: _inside == 0, timeout=WAIT_SECONDS)
    main = threading.main_thread().ident
    for owner in list(_owners):
        egraph = getattr(owner, "egraph", None)
        if egraph is not None and owner.thread != main:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(egraph))


atexit.register(_at_exit)

__all__ = ["WAIT_SECONDS", "in_egglog", "owned"]
