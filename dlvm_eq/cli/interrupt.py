"""Ctrl-C ends a command within a second, even while egglog runs a long call.

    with prompt_interrupt():      # around a command's work, on the main thread
        optimize(...)

Python runs its SIGINT handler (KeyboardInterrupt) only when the main thread is back in Python
bytecode, and an egglog call (a rule file compiled, a saturation step, a serialization) may
keep it in Rust for seconds: 20 s after SIGINT was measured. The signal's byte still reaches
`signal.set_wakeup_fd` at once; a watcher thread reads it (egglog releases the GIL while it
runs) and, when the main thread has not unwound within GRACE seconds, ends the process with
status 130 (128 + SIGINT, as a shell reports an interrupted command); a KeyboardInterrupt that
does unwind ends it the same way, without finalizing the interpreter. The compile cache writes an entry to a temporary file and renames it, so an entry is
whole or absent.
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
