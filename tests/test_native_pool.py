"""The native worker pool (codegen/native_pool.py): every call runs exactly once, on fresh,
spinning, sleeping and closed pools, from several Python threads and after fork. A hang is
the typical failure of such code, so the risky scenarios run in a subprocess with a timeout."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from dlvm_eq.codegen import CpuKernel, KernelInput, KernelSpec, Load
from dlvm_eq.codegen.native_pool import MAX_ARGS, NativePool, entry_address, native_pool, supported

pytestmark = pytest.mark.skipif(not supported(), reason="the native pool is Linux x86-64 only")

N = 1 << 18


def _kernel() -> CpuKernel:
    """out[i] = in[i] * 2 + 1: a map kernel, ABI fn(lo, hi, out, in, dims)."""
    return CpuKernel(KernelSpec("affine", (N,), [KernelInput("f32")], [Load(0) * 2.0 + 1.0]))


def _ranges(parts: int):
    step = -(-N // parts)
    return [(lo, min(lo + step, N)) for lo in range(0, N, step)]


def _run(pool, k, x, out, parts=13):
    pool.run_ranges(k.address, _ranges(parts), (out.ctypes.data, x.ctypes.data, k._dims_ptr))


def test_every_range_runs_once_with_any_number_of_parts():
    k = _kernel()
    pool = NativePool(entry_address(), 1)
    try:
        x = np.random.default_rng(0).random(N, dtype=np.float32)
        for parts in (1, 2, 3, 13, 64, 257):
            out = np.full(N, np.nan, np.float32)
            _run(pool, k, x, out, parts)
            np.testing.assert_array_equal(out, x * 2 + 1)
    finally:
        pool.close()


def test_run_passes_every_argument_slot():
    """pool.run with tuples: the kernel's ABI through the MAX_ARGS-wide call."""
    k = _kernel()
    pool = NativePool(entry_address(), 1)
    try:
        x = np.arange(N, dtype=np.float32)
        out = np.zeros(N, np.float32)
        calls = [(lo, hi, out.ctypes.data, x.ctypes.data, k._dims_ptr) for lo, hi in _ranges(5)]
        pool.run(k.address, calls)
        np.testing.assert_array_equal(out, x * 2 + 1)
        with pytest.raises(ValueError, match="int64"):
            pool.run_blocks(k.address, np.zeros((2, MAX_ARGS - 1), np.int64))
    finally:
        pool.close()


def test_sleeping_workers_are_woken():
    """With no spinning a worker futex-waits after every run; each run must wake it."""
    k = _kernel()
    pool = NativePool(entry_address(), 1, spin_us=0)
    try:
        x = np.random.default_rng(1).random(N, dtype=np.float32)
        for i in range(200):
            out = np.zeros(N, np.float32)
            if i % 10 == 0:
                time.sleep(0.002)           # the worker is asleep for sure
            _run(pool, k, x, out)
            np.testing.assert_array_equal(out, x * 2 + 1)
    finally:
        pool.close()
    assert not any(t.is_alive() for t in pool._threads)


def test_concurrent_callers_from_python_threads():
    k = _kernel()
    pool = native_pool()
    assert pool is not None or os.cpu_count() == 1
    if pool is None:
        pytest.skip("one CPU: no pool")
    xs = [np.random.default_rng(s).random(N, dtype=np.float32) for s in range(4)]
    errors = []

    def work(x):
        try:
            for _ in range(50):
                out = np.zeros(N, np.float32)
                _run(pool, k, x, out, parts=7)
                np.testing.assert_array_equal(out, x * 2 + 1)
        except AssertionError as e:     # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(x,)) for x in xs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


_SCRIPT = textwrap.dedent("""
    import os, sys, numpy as np
    from dlvm_eq.codegen import CpuKernel, KernelInput, KernelSpec, Load
    from dlvm_eq.codegen.native_pool import NativePool, entry_address, native_pool
    N = 1 << 16
    k = CpuKernel(KernelSpec("affine", (N,), [KernelInput("f32")], [Load(0) * 2.0 + 1.0]))
    x = np.arange(N, dtype=np.float32)
    entry = entry_address()
    def check(pool):
        out = np.zeros(N, np.float32)
        pool.run_ranges(k.address, [(0, N // 2), (N // 2, N)], (out.ctypes.data, x.ctypes.data, k._dims_ptr))
        assert (out == x * 2 + 1).all()
    # a run posted at once after start-up: the worker must not take it for one it has seen
    for spin in (0, 50):
        for _ in range(100):
            pool = NativePool(entry, 1, spin_us=spin)
            check(pool)
            pool.close()
    # fork: the child has no workers; it must start a pool of its own
    shared = native_pool()
    check(shared)
    pid = os.fork()
    if pid == 0:
        try:
            check(native_pool())
            os._exit(0)
        except BaseException:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    check(shared)
    print("ok")
""")


def test_start_up_race_and_fork_in_a_subprocess():
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"
