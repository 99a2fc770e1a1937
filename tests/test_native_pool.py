"""The native worker pool (codegen/runtime/native_pool.py): every call runs exactly once, on fresh,
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
from dlvm_eq.codegen.runtime.native_pool import (
    MAX_ARGS,
    NativePool,
    entry_address,
    native_pool,
    supported,
)

pytestmark = pytest.mark.skipif(not supported(), reason="the native pool is Linux x86-64 only")

N = 1 << 18


def _kernel() -> CpuKernel:
    """out[i] = in[i] * 2 + 1: a map kernel, ABI fn(lo, hi, out, in, dims)."""
    return CpuKernel(KernelSpec("affine", (N,), [KernelInput("f32")], [Load(0) * 2.0 + 1.0]))


def _ranges(parts: int):
    step = -(-N // parts)
    return [(lo, min(lo + step, N)) for lo in range(0, N, step)]


def _run(pool, k, x, out, parts=13):
    pool.run_ranges(k.address, _ranges(parts), (out.ctypes.data, x.ctypes.data, k.dims_ptr))


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
        calls = [(lo, hi, out.ctypes.data, x.ctypes.data, k.dims_ptr) for lo, hi in _ranges(5)]
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
                time.sleep(0.002)  # the worker is asleep for sure
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
        except AssertionError as e:  # pragma: no cover - reported below
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
    from dlvm_eq.codegen.runtime.native_pool import NativePool, entry_address, native_pool
    N = 1 << 16
    k = CpuKernel(KernelSpec("affine", (N,), [KernelInput("f32")], [Load(0) * 2.0 + 1.0]))
    x = np.arange(N, dtype=np.float32)
    entry = entry_address()
    def check(pool):
        out = np.zeros(N, np.float32)
        pool.run_ranges(k.address, [(0, N // 2), (N // 2, N)], (out.ctypes.data, x.ctypes.data, k.dims_ptr))
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
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


# ---------------------------------------------------------------- claiming, generations, shutdown

from pool_kernels import count_kernel  # noqa: E402

from dlvm_eq.codegen.runtime.native_pool import _tsc_per_us  # noqa: E402


def _count_run(pool, counts, chunks, ticks=0, threads=None):
    n = len(counts)
    step = -(-n // chunks)
    pool.run(
        count_kernel(),
        [(lo, min(lo + step, n), counts.ctypes.data, ticks) for lo in range(0, n, step)],
        threads,
    )


def test_helpers_that_never_start_are_not_waited_for_and_late_ones_run_nothing_stale():
    """Workers held before their loop (as if the OS never ran them): every run completes on
    the caller alone. Released, they start with old runs' generations long gone: no chunk
    of an earlier run may run again, and later runs still count each index once. (The old
    pool waited for each posted worker: this hung.)"""
    gate = threading.Event()
    pool = NativePool(entry_address(), 3, start_gate=gate)
    try:
        done = []
        for i in range(300):
            counts = np.zeros(97, np.int64)
            _count_run(pool, counts, 1 + i % 40)
            assert (counts == 1).all()
            done.append(counts)
        assert all(s["chunks"] == 0 for s in pool.worker_stats())
        gate.set()
        tick = int(_tsc_per_us())
        deadline = time.monotonic() + 60
        while sum(s["chunks"] for s in pool.worker_stats()) == 0 and time.monotonic() < deadline:
            counts = np.zeros(512, np.int64)
            _count_run(pool, counts, 64, ticks=20 * tick)  # slow chunks: helpers get some
            assert (counts == 1).all()
            done.append(counts)
        for i in range(300):
            counts = np.zeros(1 + i, np.int64)
            _count_run(pool, counts, 1 + i % 50)
            assert (counts == 1).all()
            done.append(counts)
        assert sum(s["chunks"] for s in pool.worker_stats()) > 0, "the helpers never took part"
        assert all((c == 1).all() for c in done), "a stale task ran again"
    finally:
        pool.close()


def test_close_while_helpers_are_mid_chunk_and_runs_after_close():
    """close() returns at once while a run with slow chunks is in flight on another thread;
    that run still counts every index once (its caller finishes the unclaimed chunks); a run
    after close runs on the caller alone; the workers end."""
    pool = NativePool(entry_address(), 2)
    tick = int(_tsc_per_us())
    counts = np.zeros(64, np.int64)
    # 1.5 s: a loaded machine's scheduler delayed this close 0.64 s once (load 12)
    t = threading.Thread(target=_count_run, args=(pool, counts, 64, 2000 * tick))  # 2 ms chunks
    t.start()
    time.sleep(0.01)
    t0 = time.monotonic()
    pool.close(wait=0.0)
    assert time.monotonic() - t0 < 1.5
    t.join(60)
    assert not t.is_alive() and (counts == 1).all()
    before = [s["chunks"] for s in pool.worker_stats()]
    after = np.zeros(1000, np.int64)
    _count_run(pool, after, 50)
    assert (after == 1).all()
    assert [s["chunks"] for s in pool.worker_stats()] == before  # the caller alone
    for th in pool._threads:
        th.join(10)
    assert all(s["status"] == "returned" for s in pool.worker_stats())


def test_close_parks_sleeping_and_spinning_workers_without_waiting():
    for spin in (0, 300):
        pool = NativePool(entry_address(), 2, spin_us=spin)
        counts = np.zeros(100, np.int64)
        _count_run(pool, counts, 10)
        t0 = time.monotonic()
        pool.close(wait=0.0, park=True)
        pool.close()  # twice: a no-op
        assert time.monotonic() - t0 < 1.5  # at once; room for a loaded scheduler
        deadline = time.monotonic() + 30
        while (
            any(s["status"] != "parked" for s in pool.worker_stats())
            and time.monotonic() < deadline
        ):
            time.sleep(0.01)
        assert all(s["status"] == "parked" for s in pool.worker_stats())
        assert all(th.is_alive() for th in pool._threads)  # in native code for good, not in Python


def test_exactly_once_from_many_threads_and_thread_limits():
    """8 Python threads share a pool (a busy pool makes a caller run alone); `threads` caps
    the helpers: with threads=1 no worker takes a chunk."""
    pool = NativePool(entry_address(), 3)
    try:
        errors = []

        def work(seed):
            rng = np.random.default_rng(seed)
            for _ in range(200):
                counts = np.zeros(int(rng.integers(1, 3000)), np.int64)
                _count_run(pool, counts, int(rng.integers(1, 70)))
                if not (counts == 1).all():
                    errors.append(seed)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert not errors
        before = [s["chunks"] for s in pool.worker_stats()]
        counts = np.zeros(640, np.int64)
        _count_run(pool, counts, 64, ticks=int(_tsc_per_us()) * 10, threads=1)
        assert (counts == 1).all() and [s["chunks"] for s in pool.worker_stats()] == before
    finally:
        pool.close()


def test_rest_puts_spinning_workers_to_sleep_and_the_next_run_wakes_them():
    """After a program call (rest) idle workers sleep at once instead of spinning out their
    budget, so that the user's code after the call (numpy's BLAS threads) has the cores. With
    a 60 s spin budget only rest can put them to sleep within the deadline; the next run
    still has them take part and counts every index once."""
    pool = NativePool(entry_address(), 2, spin_us=60e6)
    try:
        tick = int(_tsc_per_us())
        counts = np.zeros(512, np.int64)
        _count_run(pool, counts, 64, ticks=20 * tick)
        assert (counts == 1).all()
        # (on a quiet machine they are spinning now; on a busy one a worker that finds itself
        # descheduled may already have gone to sleep: either way rest must end in sleep)
        pool.rest()
        deadline = time.monotonic() + 20
        while (
            any(s["status"] != "asleep" for s in pool.worker_stats())
            and time.monotonic() < deadline
        ):
            time.sleep(0.01)
        assert all(s["status"] == "asleep" for s in pool.worker_stats())
        before = sum(s["chunks"] for s in pool.worker_stats())
        deadline = time.monotonic() + 60
        while (
            sum(s["chunks"] for s in pool.worker_stats()) == before and time.monotonic() < deadline
        ):
            counts = np.zeros(512, np.int64)
            _count_run(pool, counts, 64, ticks=20 * tick)
            assert (counts == 1).all()
        assert sum(s["chunks"] for s in pool.worker_stats()) > before, (
            "woken workers never took part"
        )
    finally:
        pool.close()


def test_a_compiled_call_rests_the_process_pool():
    """CpuProgram.__call__ ends with rest_workers(): the process pool's REST word is set when
    a call returns and cleared by the next parallel run."""
    import dlvm_eq as dq
    from dlvm_eq.codegen.runtime import native_pool as np_mod

    f = dq.jit(lambda x: dq.exp(x) * 2.0)
    x = np.ones(1 << 20, np.float32)
    np.testing.assert_allclose(f(x), np.exp(x) * 2, rtol=1e-6)
    pool = np_mod._POOL
    if pool is None:
        pytest.skip("no native pool here (one usable CPU)")
    assert pool.ctl[np_mod.REST] == 1
    _count_run(pool, np.zeros(64, np.int64), 8)
    assert pool.ctl[np_mod.REST] == 0


def test_the_pool_ir_file_parses_verifies_and_matches_the_constants():
    """native_pool.ll (checked in, shipped in the wheel) is well-formed LLVM IR with one entry
    and its BLAS callback, written for this module's constants; a file written for others is
    refused with the names that differ."""
    import llvmlite.binding as llvm

    from dlvm_eq.codegen.runtime import native_pool as pool_module

    text = pool_module.pool_ir()
    module = llvm.parse_assembly(text.replace("{symbol}", "dq_pool_test"))
    module.verify()
    names = {f.name for f in module.functions if not f.is_declaration}
    assert {"dq_pool_test", "dq_pool_test_blas"} <= names
    pool_module.pool_ir.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(pool_module, "MAX_ARGS", pool_module.MAX_ARGS + 1)
            with pytest.raises(
                RuntimeError, match="native_pool.ll was written for other constants: MAX_ARGS"
            ):
                pool_module.pool_ir()
    finally:
        pool_module.pool_ir.cache_clear()
