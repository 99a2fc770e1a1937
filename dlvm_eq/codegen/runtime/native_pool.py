"""Native worker threads for parallel kernels: they spin (then sleep on a futex) in compiled
code, outside the GIL, so a kernel launch reaches the other cores in well under a microsecond
instead of the 15-60 us a Python thread-pool wake-up costs on this VM.

    >>> pool = native_pool()                     # None where unsupported or with one CPU
    >>> pool.run(fn_address, [(lo, hi, *ptrs), ...])   # every tuple once, on all cores

`run` calls `fn(*args)` for each argument tuple (integers and pointers, at most MAX_ARGS
each). The kernels' parameters are all integers or pointers, so on the SysV x86-64 ABI a call
through `void (*)(i64 x MAX_ARGS)` passes them correctly (an i32 parameter reads the low half
of its slot; surplus arguments are ignored by the callee).

The threads' code is LLVM IR written by hand in native_pool.ll beside this file (`pool_ir`
loads it and checks the constants it was written for; llvmlite parses, verifies and compiles
it like every kernel).

Scheduling (what a busy machine needs; issue 11). The caller takes part and never idles while
a chunk is unclaimed: every thread claims chunks one at a time from one shared word, and the
caller then waits only for chunks that a running helper has actually claimed. A helper that
has not started, is asleep, or was descheduled before claiming is never waited for. Idle
helpers spin at most DLVM_EQ_SPIN_US (default 300 us), then futex-sleep; a helper that finds it
was descheduled while spinning (two clock readings more than GAP_US apart: the core is wanted
by someone else) halves its spin budget and sleeps; a spin that catches a run lets the budget
grow by 1/16 again. The caller's wait for claimed chunks spins within a budget kept the same
way (halved by a wait that overran or was descheduled), then futex-sleeps with a timeout, so
that a descheduled helper can run on the caller's core. A run posted while another
Python thread's run is in flight is run on that caller's thread alone, not queued.

Generations (the ABA problem). The claim word `state` is (generation << 32 | next chunk).
A run stores the task (fn, blocks, n), then publishes (gen + 1, 0); a claim is a CAS from
(gen, i) to (gen, i + 1), so it succeeds only within the run whose task was read. When every
chunk is claimed the caller stores (gen, CLOSED): it never goes back to (gen, i < n), so a late
helper holding an old (gen, i) fails its CAS and never runs a stale task or a new task's chunk
twice. The next task is stored only after that and after every claimed chunk is done.

Ownership. One run holds the shared task at a time: `owner` goes 0 -> 1 by compare-and-swap
(a run posted while another is in flight, from Python or from OpenBLAS, does not queue: ours
runs alone on its caller, OpenBLAS's on threads of its own). With DLVM_EQ_BLAS_POOL=1 the pool
also runs OpenBLAS's threaded calls (`{symbol}_blas`, installed by blas_threads.py): OpenBLAS's
jobs wait for each other, so they run only where each has a thread (the pool when it is free
and has enough workers, else threads made for the call), and one such call at a time (a futex
mutex: OpenBLAS gives the jobs of every call the same per-thread buffers).

Shutdown never waits without bound: `close` takes the pool (waiting only for a run in flight,
whose chunks all run), sets `stop` and futex-wakes every sleeper; it waits for the threads (at
most `wait` seconds) only when asked. At exit (atexit) the workers are told to park: they end
in a futex wait of their own in native code and never return into a finalizing interpreter (a
daemon thread taking the GIL then is ended or hung by CPython). The control block is allocated
outside Python (never freed: a worker may still read it while the interpreter tears down its
objects). After fork the child has no workers: the parent's pools run on the calling thread
alone there, and `native_pool()` starts a new one.

Layout of the control block (int64 words; words one thread writes often are on lines of
their own): [state, fn, blocks, n, helpers, syscall, spin, gap] [done, caller_waiting,
caller_budget, wait_ticks, waits_slept, -] [wake, sleepers, stop, rest] [timeout_s, timeout_ns,
min_spin, owner, blas_cb, pthread_create, pthread_join, workers], then per worker [chunks, status, budget, preemptions, park, -, -, -]; spin, gap and budgets in TSC
ticks. The thread count is `cpu_count.usable_cpus()` (DLVM_EQ_NUM_THREADS, affinity, cgroup
quota); with one usable CPU there is no pool at all.

Module state: `_POOL` (the process's pool, made under `_POOL_LOCK`) and `_LIVE` (pools to
reset after fork) are written only under `_POOL_LOCK` or in the fork child, single-threaded.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import platform
import re
import threading
import time
import weakref
from pathlib import Path

import numpy as np

from ...config import settings
from .cpu_count import usable_cpus

MAX_ARGS = 32
SPIN_US = settings().spin_us  # how long idle workers keep spinning (DLVM_EQ_SPIN_US, read at load)
GAP_US = 30.0  # a pause loop iteration this long means the thread was descheduled
MIN_SPIN_US = 5.0  # the budget's floor: runs of one step come every few microseconds
WAIT_TIMEOUT_NS = 200_000  # the caller's futex wait for claimed chunks re-checks this often
CLOSED = 0xFFFFFFFF  # `state`'s chunk field once a run's chunks are all claimed
MAX_CHUNKS = 1 << 31

# word indices in the control block
STATE, FN, BLOCKS, N, HELPERS, SYSCALL, SPIN, GAP = range(8)
DONE, CALLER_WAITING, CALLER_BUDGET, WAIT_TICKS, WAITS_SLEPT = 8, 9, 10, 11, 12
WAKE, SLEEPERS, STOP, REST = 16, 17, 18, 19
TIMEOUT_S, TIMEOUT_NS, MIN_SPIN = 24, 25, 26
OWNER, BLAS_CB, PTHREAD_CREATE, PTHREAD_JOIN, WORKERS = 27, 28, 29, 30, 31
BLAS_POOLED, BLAS_THREADED = 20, 21  # OpenBLAS calls run on the pool / on threads of their own
BLAS_LOCK = 22  # one OpenBLAS call through the callback at a time
_HEADER = 32
_LINE = 8
W_CHUNKS, W_STATUS, W_BUDGET, W_PREEMPTED, W_PARK = range(5)
STATUS = {0: "running", 1: "asleep", 2: "parked", 3: "returned"}
STOP_RETURN, STOP_PARK = 1, 2
SYS_FUTEX = 202  # x86-64 Linux
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129

# The pool's code is LLVM IR in native_pool.ll beside this file (shipped in the wheel); these
# are the numbers written into it, checked when it is loaded (`pool_ir`).
BAKED = (
    "BLAS_CB", "BLAS_LOCK", "BLAS_POOLED", "BLAS_THREADED", "BLOCKS", "CALLER_BUDGET",
    "CALLER_WAITING", "CLOSED", "DONE", "FN", "FUTEX_WAIT_PRIVATE", "FUTEX_WAKE_PRIVATE", "GAP",
    "HELPERS", "MAX_ARGS", "MIN_SPIN", "N", "OWNER", "PTHREAD_CREATE", "PTHREAD_JOIN", "REST",
    "SLEEPERS", "SPIN", "STOP", "STOP_PARK", "SYSCALL", "SYS_FUTEX", "TIMEOUT_S", "WAITS_SLEPT",
    "WAIT_TICKS", "WAKE", "WORKERS", "W_BUDGET", "W_PARK", "W_PREEMPTED", "W_STATUS", "_HEADER",
    "_LINE",
)  # fmt: skip
POOL_IR_FILE = Path(__file__).with_name("native_pool.ll")


@functools.cache
def pool_ir() -> str:
    """The text of native_pool.ll (`{symbol}` where the entry's name goes), once its list of
    baked-in constants (`; const NAME = VALUE`) is found equal to this module's."""
    text = POOL_IR_FILE.read_text()
    written = {k: int(v) for k, v in re.findall(r"^; const (\w+) = (\d+)$", text, re.M)}
    expected = {k: globals()[k] for k in BAKED}
    if written != expected:
        differ = sorted(
            k for k in written.keys() | expected.keys() if written.get(k) != expected.get(k)
        )
        raise RuntimeError(
            f"{POOL_IR_FILE.name} was written for other constants: {', '.join(differ)}"
        )
    return text


def _alloc_forever(nbytes: int) -> int:
    """Zeroed, 64-byte aligned memory from the C heap, never freed: workers may still read a
    pool's control block while the interpreter frees its objects at exit."""
    libc = ctypes.CDLL(None)
    libc.aligned_alloc.restype = ctypes.c_void_p
    libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    size = -(-nbytes // 64) * 64
    addr = libc.aligned_alloc(64, size)
    if not addr:
        raise MemoryError("native pool: no memory for the control block")
    ctypes.memset(addr, 0, size)
    return addr


class NativePool:
    """`workers` native threads plus the caller; see the module docstring. `start_gate` (for
    tests): the workers enter their loop only once this threading.Event is set."""

    max_args = MAX_ARGS

    def __init__(
        self,
        entry: int,
        workers: int,
        spin_us: float = SPIN_US,
        start_gate: threading.Event | None = None,
    ):
        self.workers = workers
        self._entry = ctypes.CFUNCTYPE(
            None, ctypes.c_int64, ctypes.c_void_p, *[ctypes.c_int64] * 4
        )(entry)
        words = _HEADER + _LINE * workers
        self._ctl_addr = _alloc_forever(8 * words)
        self.ctl = np.ctypeslib.as_array((ctypes.c_int64 * words).from_address(self._ctl_addr))
        ctl, tsc = self.ctl, _tsc_per_us()
        ctl[STATE] = CLOSED  # generation 0, no run open
        ctl[SYSCALL] = ctypes.cast(ctypes.CDLL(None).syscall, ctypes.c_void_p).value
        ctl[SPIN] = ctl[CALLER_BUDGET] = int(spin_us * tsc)
        ctl[MIN_SPIN] = min(int(MIN_SPIN_US * tsc), ctl[SPIN])
        ctl[GAP] = int(GAP_US * tsc)
        ctl[TIMEOUT_NS] = WAIT_TIMEOUT_NS
        for w in range(workers):
            ctl[_HEADER + _LINE * w + W_BUDGET] = ctl[SPIN]
        ctl[WORKERS] = workers
        libc = ctypes.CDLL(None)
        ctl[PTHREAD_CREATE] = ctypes.cast(libc.pthread_create, ctypes.c_void_p).value
        ctl[PTHREAD_JOIN] = ctypes.cast(libc.pthread_join, ctypes.c_void_p).value
        self._lock = threading.Lock()
        self._closed = False
        self._threads = [
            threading.Thread(
                target=self._work, args=(w, start_gate), daemon=True, name=f"dq-native-{w}"
            )
            for w in range(workers)
        ]
        for t in self._threads:
            t.start()
        with _LIVE_LOCK:
            _LIVE.add(self)

    def _work(self, w: int, gate: threading.Event | None) -> None:
        if gate is not None:
            gate.wait()
        self._entry(0, self._ctl_addr, w, 0, 0, 0)

    def run(self, fn: int, calls: list[tuple], threads: int | None = None) -> None:
        """fn(*args) for every args in `calls` (tuples of one length), on the workers and the
        calling thread (at most `threads` threads in all)."""
        blocks = np.zeros((len(calls), MAX_ARGS), np.int64)
        blocks[:, : len(calls[0])] = calls
        self.run_blocks(fn, blocks, threads)

    def run_ranges(
        self, fn: int, ranges: list[tuple[int, int]], tail: tuple, threads: int | None = None
    ) -> None:
        """fn(lo, hi, *tail) for every (lo, hi) in `ranges` (the kernels' common shape: a few
        numpy stores instead of one Python tuple per chunk)."""
        blocks = np.empty((len(ranges), MAX_ARGS), np.int64)
        blocks[:, 2 : 2 + len(tail)] = tail
        blocks[:, :2] = ranges
        self.run_blocks(fn, blocks, threads)

    def run_blocks(self, fn: int, blocks: np.ndarray, threads: int | None = None) -> None:
        """The calls' arguments as rows of an (n, MAX_ARGS) int64 array."""
        n = len(blocks)
        if (
            blocks.dtype != np.int64
            or blocks.shape[1:] != (MAX_ARGS,)
            or not blocks.flags.c_contiguous
        ):
            raise ValueError(f"blocks must be a C-contiguous (n, {MAX_ARGS}) int64 array")
        if n >= MAX_CHUNKS:
            raise ValueError(f"at most {MAX_CHUNKS - 1} calls per run, got {n}")
        if n == 0:
            return
        helpers = min(self.workers, n - 1, (threads or n) - 1)
        ptr = blocks.ctypes.data
        # One run at a time owns the shared task; a caller that finds the pool busy (another
        # Python thread's run) runs its own calls rather than wait for that run to end.
        if helpers <= 0 or self._closed or not self._lock.acquire(blocking=False):
            self._entry(3, self._ctl_addr, fn, ptr, n, 0)
            return
        try:
            self._entry(1, self._ctl_addr, fn, ptr, n, helpers)
        finally:
            self._lock.release()

    def blas_callback(self) -> int:
        """The address of a function for OpenBLAS's `openblas_set_threads_callback_function`
        that runs its jobs on this pool's threads (runtime/blas_threads.py)."""
        self._entry(4, self._ctl_addr, 0, 0, 0, 0)
        return int(self.ctl[BLAS_CB])

    def hold_blas(self, hold: bool) -> None:
        """Take (True) or release (False) the mutex every OpenBLAS call through our callback
        holds: taken, no OpenBLAS job runs (blas_threads.py, around a fork)."""
        self._entry(5 if hold else 6, self._ctl_addr, 0, 0, 0, 0)

    def rest(self) -> None:
        """Idle workers sleep now instead of spinning out their budget; the next run wakes
        them (and clears this). Called when a compiled program call returns: the user's code
        that runs next (numpy, whose OpenBLAS threads spin too) gets every core."""
        self.ctl[REST] = 1

    def close(self, wait: float = 1.0, park: bool = False) -> None:
        """Stop the workers: set `stop` and wake every sleeper, then join the threads for at
        most `wait` seconds. Never blocks longer; safe to call twice, and concurrently with
        runs (those finish on their callers). park: the workers never return to Python (at
        exit; see the module docstring)."""
        if self._closed:
            return
        self._closed = True
        self._entry(2, self._ctl_addr, STOP_PARK if park else STOP_RETURN, 0, 0, 0)
        if park:
            return
        deadline = time.monotonic() + wait
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def worker_stats(self) -> list[dict]:
        """Per worker: chunks run, status (running/asleep/parked/returned), spin budget (us)
        and how often it found itself descheduled while spinning."""
        tsc = _tsc_per_us()
        out = []
        for w in range(self.workers):
            line = self.ctl[_HEADER + _LINE * w :][:_LINE]
            out.append(
                dict(
                    chunks=int(line[W_CHUNKS]),
                    status=STATUS.get(int(line[W_STATUS]), "?"),
                    spin_us=line[W_BUDGET] / tsc,
                    preempted=int(line[W_PREEMPTED]),
                )
            )
        return out

    def caller_stats(self) -> dict:
        """Callers' time waiting for chunks that helpers had claimed (us, all runs so far),
        how many of those waits slept, and the callers' current spin budget (us)."""
        tsc = _tsc_per_us()
        return dict(
            wait_us=self.ctl[WAIT_TICKS] / tsc,
            waits_slept=int(self.ctl[WAITS_SLEPT]),
            spin_us=self.ctl[CALLER_BUDGET] / tsc,
            blas_pooled=int(self.ctl[BLAS_POOLED]),
            blas_threaded=int(self.ctl[BLAS_THREADED]),
        )

    def _after_fork_in_child(self) -> None:
        """The child has none of the workers: every run is the caller's alone from now on
        (stopped and owned in the child's copy of the control block: OpenBLAS's jobs, should
        they still come here, run on threads of their own)."""
        self._lock = threading.Lock()
        self._closed = True
        self.ctl[OWNER] = 1
        self.ctl[STOP] = STOP_RETURN
        self._threads = []


def _tsc_per_us() -> float:
    """TSC ticks per microsecond (spin budgets are measured with rdtsc)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":")[1])
    except OSError:
        pass
    return 2500.0


def supported() -> bool:
    return platform.system() == "Linux" and platform.machine() == "x86_64"


_POOL: NativePool | None = None
_POOL_LOCK = threading.Lock()
_LIVE_LOCK = threading.Lock()
_LIVE: weakref.WeakSet[NativePool] = weakref.WeakSet()


def entry_address() -> int:
    """Address of the compiled pool function (compiled once, cached like every kernel)."""
    from types import SimpleNamespace

    from .jit import JIT  # LLVM loads only when a pool starts

    text = pool_ir()
    symbol = "dq_pool_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return JIT.address(SimpleNamespace(text=text.replace("{symbol}", symbol), symbol=symbol))


def running_pool() -> NativePool | None:
    """The process's native pool if one was started, else None (never starts one)."""
    return _POOL


_prebuilt: list[threading.Thread] = []  # the one thread compiling the pool's code, once started


def prebuild() -> None:
    """Compile the pool's code on another thread now, where a pool will start (x86-64 Linux,
    another usable CPU, DLVM_EQ_NATIVE_POOL on) and none has: called at the start of a cpu
    compile, so that LLVM's ~0.1 s CPU on it (a cold cache) runs beside the e-graph, outside
    the GIL (cpu/llvm_unlocked.py), instead of in the first call. Once per process."""
    if _POOL is not None or _prebuilt or not supported() or not settings().native_pool:
        return
    if usable_cpus() < 2:
        return
    # the caller imports the JIT module (a warm call needs it too): the thread below then imports
    # only the IR builders, on a miss, and fewer imports run on two threads at once
    from . import jit  # noqa: F401

    with _POOL_LOCK:
        if not _prebuilt:
            t = threading.Thread(target=_build_entry, name="dlvm_eq-pool-prebuild")
            t.start()  # under the lock: native_pool() never joins a thread not yet started
            _prebuilt.append(t)


def _build_entry() -> None:
    try:
        entry_address()
    except Exception:  # native_pool() builds it again in the caller, and raises there
        pass


def native_pool() -> NativePool | None:
    """The process's native pool (usable_cpus() - 1 workers), started on first use; None where
    it is unsupported or there is one usable CPU (no helper thread is started then)."""
    global _POOL
    if _POOL is None:
        if not supported() or usable_cpus() < 2:
            return None
        for t in list(_prebuilt):  # its code compiled there: entry_address() finds it
            t.join()
        entry = entry_address()
        with _POOL_LOCK:
            if _POOL is None:
                _POOL = NativePool(entry, usable_cpus() - 1)
                atexit.register(_POOL.close, 0.0, True)  # no wait; the workers park
                if settings().blas_pool:
                    from . import blas_threads

                    if blas_threads.install(_POOL):
                        # atexit runs last-registered first: OpenBLAS has its threads back
                        # before the workers park
                        atexit.register(blas_threads.uninstall)
    return _POOL


def _after_fork_in_child() -> None:
    global _POOL, _POOL_LOCK, _LIVE_LOCK
    _POOL_LOCK, _LIVE_LOCK = threading.Lock(), threading.Lock()  # maybe held at the fork
    for pool in list(_LIVE):
        pool._after_fork_in_child()
    _POOL = None  # the child starts a pool of its own on first use
    _prebuilt.clear()  # a prebuild thread of the parent's does not run here


os.register_at_fork(after_in_child=_after_fork_in_child)
