"""Ctrl-C ends a command within a second, in every phase.

    with prompt_interrupt():      # around a command's work, on the main thread
        optimize(...)

Python runs its SIGINT handler (KeyboardInterrupt) only when the main thread is back in Python
bytecode, and a native call may keep it away for seconds: an egglog call (a rule file compiled,
a saturation step; 20 s after SIGINT was measured), or one that holds the GIL (json.loads of a
large serialized e-graph: 3.2 s measured, during which no other thread runs either).

- As the `dlvm-eq` program, SIGINT gets its default action for the command's duration: the
  kernel ends the process at once, whatever it runs (a shell reports status 130). The compile
  cache writes an entry to a temporary file and renames it, and `opt -o` writes its output the
  same way, so a file is whole or absent.
- Called in-process (`main([...])` from Python, a test): the caller's process must survive, so
  a watcher thread reads SIGINT's byte from `signal.set_wakeup_fd` (egglog releases the GIL
  while it runs) and, when KeyboardInterrupt has not unwound within GRACE seconds, ends the
  process with status 130; one that unwinds ends it the same way, without finalizing the
  interpreter (0.4 s with sympy loaded).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

from . import PROG

GRACE = 0.25  # seconds for KeyboardInterrupt to unwind in Python before the process is ended
EXIT_INTERRUPTED = 130


@contextmanager
def prompt_interrupt(grace: float = GRACE):
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):  # another thread, or a caller that handles SIGINT itself: leave it alone
        yield
        return
    if _is_program():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:  # not the main interpreter's main thread
        os.close(r)
        os.close(w)
        yield
        return
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(r, done, grace), daemon=True)
    watcher.start()
    try:
        yield
    except KeyboardInterrupt:
        # ending the interpreter normally finalizes sympy's and egglog's modules (0.4 s
        # measured), during which no thread runs: end the process now
        _exit()
    finally:
        done.set()
        signal.set_wakeup_fd(old)
        os.close(w)  # the watcher reads end-of-file and returns
        watcher.join(1.0)
        os.close(r)


def _is_program() -> bool:
    """Whether this process is the dlvm-eq program (`dlvm-eq ...`, `python -m dlvm_eq.cli`)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "dlvm_eq.cli.__main__" or (
        bool(sys.argv) and os.path.basename(sys.argv[0]) == PROG
    )


def _exit() -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    try:
        sys.stderr.write(f"{PROG}: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_INTERRUPTED)


def _watch(r: int, done: threading.Event, grace: float) -> None:
    while True:
        try:
            data = os.read(r, 64)
        except OSError:
            return
        if not data or done.is_set():
            return
        if signal.SIGINT in data and not done.wait(grace):
            _exit()  # the main thread is still inside a native call
