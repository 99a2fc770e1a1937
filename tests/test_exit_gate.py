"""A process whose main thread exits while a daemon thread compiles a straight function for a
new signature (inside egglog) exits cleanly: return code 0, no abort ("FATAL: exception not
rethrown"), no segfault, no "unsendable ... dropped on another thread" (egraph/exit_gate.py).
Before the gate, 3 runs of 3 aborted or crashed (rc 134 / 139)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import contextlib, sys, tempfile, threading, time
import numpy as np
import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
import dlvm_eq.egraph.session as session

set_cache_dir(tempfile.mkdtemp(prefix="exit-gate-cache"))
entered = threading.Event()
real = session.in_egglog

@contextlib.contextmanager
def spied():  # tells the main thread when the daemon thread is inside egglog
    with real():
        if threading.current_thread() is not threading.main_thread():
            entered.set()
        yield

if {spy}:
    session.in_egglog = spied

def loss(w, x):
    return dq.sum(dq.tanh(x @ w) * dq.sigmoid(x @ w + 1.0) + dq.exp(-x @ w))

g = dq.jit(dq.grad(loss))

def forever():  # a new signature each call: each builds e-graphs
    n = 2
    while True:
        g(np.ones((8, n), np.float32), np.ones((n + 1, 8), np.float32))
        n += 1

threading.Thread(target=forever, daemon=True).start()
entered.wait() if {spy} else time.sleep({delay})
sys.exit(0)
"""

BAD = ("FATAL", "Fatal Python error", "unsendable", "panicked", "Traceback")


def _run(tmp_path: Path, spy: bool, delay: float) -> tuple[int, str]:
    script = tmp_path / f"exit_{spy}_{delay}.py"
    script.write_text(textwrap.dedent(SCRIPT.format(spy=spy, delay=delay)))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the process did not exit within 300 s")
    return proc.returncode, err


@pytest.mark.parametrize("spy,delay", [(True, 0.0), (False, 0.0), (False, 0.03)])
def test_exit_while_a_daemon_thread_compiles_in_egglog(tmp_path, spy, delay):
    rc, err = _run(tmp_path, spy, delay)
    assert rc == 0, err[-2000:]
    assert not any(b in err for b in BAD), err[-2000:]
