"""Every process that ran compiled code exits (issue 11: 7 of 10 runs of the first script
below hung at exit, spinning in NativePool.close). 100 fresh processes, four at a time, each
with a generous limit: the issue's script; a process that exits while another Python thread
is inside a compiled GEMM / kernel; one that forks, child and parent both running compiled
code; one with DLVM_EQ_NUM_THREADS=1; and the first three with OpenBLAS's jobs on the native pool
(DLVM_EQ_BLAS_POOL=1). A hang is a failure, so is any exit code but 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 60  # per process: a hang, not a slow machine
AT_ONCE = 4

_ISSUE = """
import numpy as np, dlvm_eq as dq
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 784)).astype(np.float32)
w = (rng.standard_normal((784, 256)) * 0.05).astype(np.float32)
f = dq.jit(lambda x, w: dq.relu(x @ w))
for _ in range(50): f(x, w)
"""

_MID_CALL = (
    _ISSUE
    + """
import sys, threading, time
g = dq.jit(lambda x, w: dq.sum(dq.tanh(x @ w) * 2.0, axis=1))
g(x, w)
def forever():
    while True:
        f(x, w); g(x, w)
threading.Thread(target=forever, daemon=True).start()
time.sleep(0.05 + 0.01 * int(sys.argv[1]))    # exit at some point of a call on the thread
"""
)

_FORK = (
    _ISSUE
    + """
import os
import signal
want = np.maximum(x.astype(np.float64) @ w, 0)
pid = os.fork()
ok = np.allclose(f(x, w), want, rtol=1e-4, atol=1e-4)
for _ in range(20): f(x, w)
if pid == 0:
    raise SystemExit(0 if ok else 3)          # the child leaves through atexit too
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert ok
"""
)

# OpenBLAS's jobs on the pool (DLVM_EQ_BLAS_POOL=1): numpy's own products on another thread too,
# at exit and across a fork
_BLAS_MID_CALL = _MID_CALL.replace(
    "f(x, w); g(x, w)", "f(x, w); g(x, w); x @ w; x.astype(np.float64) @ w"
)
BLAS = {"DLVM_EQ_BLAS_POOL": "1"}

SCRIPTS = (
    [("issue", _ISSUE, {})] * 40
    + [("mid-call", _MID_CALL, {})] * 10
    + [("fork", _FORK, {})] * 10
    + [("one thread", _ISSUE, {"DLVM_EQ_NUM_THREADS": "1"})] * 10
    + [("blas pool", _ISSUE, BLAS)] * 10
    + [("blas pool mid-call", _BLAS_MID_CALL, BLAS)] * 10
    + [
        (
            "blas pool fork",
            _FORK + "\nassert np.allclose(np.maximum(x @ w, 0), want, rtol=1e-4, atol=1e-4)\n",
            BLAS,
        )
    ]
    * 10
)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = dict(
        os.environ, PYTHONPATH=str(ROOT), DLVM_EQ_CACHE_DIR=str(tmp_path_factory.mktemp("cache"))
    )
    env.pop("DLVM_EQ_NUM_THREADS", None)
    # warm the compile cache once, so that the processes below load their kernels
    warm = subprocess.run(
        [sys.executable, "-c", _MID_CALL.replace("time.sleep", "(lambda s: None)"), "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert warm.returncode == 0, warm.stderr[-3000:]
    return env


def _kill_leftovers(pgid: int) -> None:
    """A fork child still running after its parent exited is a hang too: end it (the
    parent's waitpid makes that rare; it shows up as the parent's failure)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def test_a_hundred_processes_all_exit(env):
    assert len(SCRIPTS) == 100
    todo = list(enumerate(SCRIPTS))
    running: list[tuple] = []
    failures = []
    while todo or running:
        while todo and len(running) < AT_ONCE:
            i, (name, script, extra) = todo.pop(0)
            err = tempfile.TemporaryFile("w+")  # not a pipe: a full one would block the child
            # a session of its own: a hung fork child is killed with its parent (killpg)
            proc = subprocess.Popen(
                [sys.executable, "-c", script, str(i % 10)],
                env=dict(env, **extra),
                stdout=subprocess.DEVNULL,
                stderr=err,
                text=True,
                start_new_session=True,
            )
            running.append((proc, name, time.monotonic(), err))
        time.sleep(0.05)
        for item in list(running):
            proc, name, started, err = item
            if proc.poll() is not None:
                _kill_leftovers(proc.pid)
                running.remove(item)
                if proc.returncode != 0:
                    err.seek(0)
                    failures.append(f"{name}: exit code {proc.returncode}: {err.read()[-1500:]}")
                err.close()
            elif time.monotonic() - started > LIMIT_S:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                err.close()
                running.remove(item)
                failures.append(f"{name}: still running after {LIMIT_S} s (hung at exit?)")
    assert not failures, f"{len(failures)} of 100 failed:\n" + "\n".join(failures[:10])
