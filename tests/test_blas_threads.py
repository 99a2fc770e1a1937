"""OpenBLAS's threaded calls on the native pool (DLVM_EQ_BLAS_POOL=1, runtime/blas_threads.py).
Each case runs in a process of its own (the callback is process-wide state of numpy's
OpenBLAS), under a time limit: a hang (a level-3 job left without a thread) is a failure.
Products must equal OpenBLAS's own threads' bit for bit (the jobs are OpenBLAS's; only the
threads change), and the pool's counters must show which path ran them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dlvm_eq.codegen.runtime import blas_threads, native_pool

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 120  # a hang (a fork that never returns, say) ends as a failure here

pytestmark = pytest.mark.skipif(
    not native_pool.supported(), reason="the native pool is x86-64 Linux only"
)

_PRELUDE = """
import numpy as np, threading
from dlvm_eq.codegen.runtime.native_pool import native_pool
from dlvm_eq.codegen.runtime import blas_threads as bt
rng = np.random.default_rng(0)
def operands():
    out = []
    for m, k, n, dt in [(256, 784, 256, np.float32), (300, 200, 500, np.float64),
                        (64, 288, 2048, np.float32), (700, 700, 700, np.float64)]:
        a, b = rng.standard_normal((m, k)).astype(dt), rng.standard_normal((k, n)).astype(dt)
        out += [(a, b), (np.ascontiguousarray(a.T).T, b), (a, np.asfortranarray(b))]
    return out
pairs = operands()
want = [a @ b for a, b in pairs]          # OpenBLAS's own threads
def all_right():
    return all(np.array_equal(a @ b, w) for (a, b), w in zip(pairs, want))
"""


def _run(script: str, **env) -> str:
    environ = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    environ.pop("DLVM_EQ_NUM_THREADS", None)
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(script)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _run_ok(script: str, **env) -> None:
    """The script (ending in print("ok")) ran to its end."""
    assert _run(script, **env).strip() == "ok"


def _needs_callback():
    out = _run("""
        import ctypes
        ok = any(bt._function(ctypes.CDLL(p), bt._SETTERS) is not None for p in bt.loaded_openblas())
        print("yes" if ok and native_pool() is not None else "no")
    """)
    if out.strip() != "yes":
        pytest.skip("numpy's BLAS is not an OpenBLAS with the threads callback, or one CPU")


def test_products_on_the_pool_equal_openblas_threads():
    _needs_callback()
    _run_ok("""
        pool = native_pool()
        assert bt.install(pool) and bt.installed()
        got = [a @ b for a, b in pairs]
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
        stats = pool.caller_stats()
        assert stats["blas_pooled"] >= 6, stats        # the threaded ones ran on the pool
        bt.uninstall()
        assert all_right()
        assert pool.caller_stats()["blas_pooled"] == stats["blas_pooled"]   # back on OpenBLAS's
        print("ok")
    """)


def test_the_setting_installs_it_and_is_off_by_default():
    _needs_callback()
    assert _run("native_pool(); print(bt.installed())").strip() == "False"
    assert _run("native_pool(); print(bt.installed())", DLVM_EQ_BLAS_POOL="1").strip() == "True"
    # a compiled program with a product starts the pool for it (its kernels may be too small
    # to start it themselves)
    program = """
        import dlvm_eq as dq
        a, b = pairs[0]
        assert np.allclose(dq.jit(lambda a, b: a @ b)(a, b), want[0], rtol=1e-4, atol=1e-3)
        print(bt.installed())
    """
    assert _run(program, DLVM_EQ_BLAS_POOL="1").strip() == "True"
    assert _run(program).strip() == "False"


def test_many_threads_beside_compiled_kernels():
    """Python threads' products meet each other and the program's kernels on the pool: a call
    that finds it busy runs its jobs on threads of its own."""
    _needs_callback()
    _run_ok("""
        import dlvm_eq as dq
        x = rng.standard_normal((256, 784)).astype(np.float32)
        w = (rng.standard_normal((784, 256)) * 0.05).astype(np.float32)
        f = dq.jit(lambda x, w: dq.sum(dq.tanh(x @ w), axis=1))
        ref = np.tanh(x.astype(np.float64) @ w).sum(axis=1)
        pool = native_pool()
        assert bt.install(pool)
        bad = []
        def products(i):
            for _ in range(15):
                for (a, b), wnt in zip(pairs[i::4], want[i::4]):
                    if not np.array_equal(a @ b, wnt):
                        bad.append("product")
        def program():
            for _ in range(30):
                if not np.allclose(f(x, w), ref, rtol=1e-3, atol=1e-2):
                    bad.append("program")
        threads = [threading.Thread(target=products, args=(i,)) for i in range(4)]
        threads += [threading.Thread(target=program) for _ in range(2)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not bad, bad[:5]
        assert pool.caller_stats()["blas_pooled"] > 0
        print("ok")
    """)


def test_a_busy_pool_leaves_them_threads_of_their_own():
    """While a run holds the pool (here: its owner word, held by hand), a call cannot wait for
    it (the run may be the caller's own) nor run its jobs one after another (they wait for each
    other): each job gets a thread made for it."""
    _needs_callback()
    _run_ok("""
        from dlvm_eq.codegen.runtime.native_pool import OWNER
        pool = native_pool()
        assert bt.install(pool)
        pool.ctl[OWNER] = 1
        assert all_right()
        stats = pool.caller_stats()
        assert stats["blas_threaded"] >= 6 and stats["blas_pooled"] == 0, stats
        pool.ctl[OWNER] = 0
        assert all_right()
        assert pool.caller_stats()["blas_pooled"] >= 6
        print("ok")
    """)


def test_a_closed_pool_runs_them_on_threads_of_their_own():
    _needs_callback()
    _run_ok("""
        pool = native_pool()
        assert bt.install(pool)
        pool.close()
        assert all_right()
        stats = pool.caller_stats()
        assert stats["blas_threaded"] >= 6 and stats["blas_pooled"] == 0, stats
        print("ok")
    """)


def test_a_fork_child_gets_openblas_threads_back():
    _needs_callback()
    _run_ok("""
        import os
        pool = native_pool()
        assert bt.install(pool)
        pid = os.fork()
        if pid == 0:
            ok = not bt.installed() and all_right()
            os._exit(0 if ok else 3)
        ok = all_right()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert ok and bt.installed()
        print("ok")
    """)


def test_fork_while_another_thread_runs_compiled_products():
    """The parent's fork returns (issue 34: OpenBLAS's prefork handler waited forever for a
    server thread whose wake-up a job of ours erased), and the busy thread goes on."""
    _needs_callback()
    out = _run(
        """
        import os, time
        import dlvm_eq as dq
        f = dq.jit(lambda w, x: dq.sum(dq.tanh(x @ w)))
        w, x = rng.standard_normal((2, 512, 512)).astype(np.float32)
        want = f(w, x)
        assert bt.installed()
        stop, calls = False, [0]
        def busy():
            while not stop:
                assert f(w, x) == want
                calls[0] += 1
        t = threading.Thread(target=busy, daemon=True)
        t.start()
        while calls[0] < 2:
            time.sleep(0.01)
        codes = []
        for _ in range(30):
            time.sleep(0.02)  # the busy thread takes the GIL and starts a product
            pid = os.fork()
            if pid == 0:  # no product here: the child may inherit OpenBLAS's level-3 lock held
                os._exit(0 if not bt.installed() else 3)
            codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        stop = True
        t.join()
        print(codes, calls[0] > 2)
        """,
        DLVM_EQ_BLAS_POOL="1",
        DLVM_EQ_GEMM="0",  # the compiled products are OpenBLAS's (conftest sets our GEMM)
    )
    assert out.strip() == f"{[0] * 30} True"


def test_no_openblas_leaves_nothing_installed(monkeypatch):
    monkeypatch.setattr(blas_threads, "loaded_openblas", lambda: [])
    assert blas_threads.install(object()) is False and not blas_threads.installed()
    assert blas_threads.install(None) is False
