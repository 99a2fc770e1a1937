"""Native worker threads for parallel kernels: the workers spin (then sleep on a futex) in
compiled code, outside the GIL, so a kernel launch reaches the other cores in well under a
microsecond instead of the 15-60 us a Python thread-pool wake-up costs on this VM (measured:
with Python workers the MLP's 256x784x256 GEMM spent ~150 us of its ~550 us waiting for the
second thread to start).

    >>> pool = native_pool()                     # None where unsupported (not Linux x86-64)
    >>> pool.run(fn_address, [(lo, hi, *ptrs), ...])   # every tuple once, on all cores

`run` calls `fn(*args)` for each argument tuple (integers and pointers, at most MAX_ARGS
each; tuples are taken from a shared atomic counter, so a descheduled thread holds up
little). The caller's thread takes part. The kernels' parameters are all integers or pointers,
so on the SysV x86-64 ABI a call through `void (*)(i64 x MAX_ARGS)` passes them correctly (an
i32 parameter reads the low half of its slot; surplus arguments are ignored by the callee).

Layout of the pool's control block (int64 words; each worker's words on a cache line of their
own): header [counter, fn, blocks, nblocks, stop, syscall, spin_cycles, -], then per worker
[seq, done, sleeping, -, -, -, -, -]. A worker waits for its `seq` to change: it spins for
`spin_cycles` TSC ticks, then sets `sleeping` and futex-waits on `seq`; `run` stores the new
`seq` (sequentially consistent) and wakes it only if it was sleeping.
"""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import platform
import threading

import numpy as np

MAX_ARGS = 32
SPIN_US = float(os.environ.get("DLVM_EQ_SPIN_US", "300"))  # how long idle workers keep spinning
_HEADER = 8
_LINE = 8
SYS_FUTEX = 202              # x86-64 Linux
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129

_ARGS = ", ".join(["i64"] * MAX_ARGS)
_LOADS = "\n".join(
    f"  %p{i} = getelementptr i64, ptr %blk, i64 {i}\n  %a{i} = load i64, ptr %p{i}"
    for i in range(MAX_ARGS))
_CALL_ARGS = ", ".join(f"i64 %a{i}" for i in range(MAX_ARGS))

# One function, `op` selects: 0 = worker loop of worker `w` (returns when `stop` is set),
# 1 = run: hand the blocks to workers 0..w-1, drain with them, wait for them.
POOL_IR = f"""
declare void @llvm.x86.sse2.pause()
declare i64 @llvm.readcyclecounter()

define internal void @drain(ptr %pool) {{
entry:
  %fnp = getelementptr i64, ptr %pool, i64 1
  %fni = load i64, ptr %fnp
  %fn = inttoptr i64 %fni to ptr
  %bp = getelementptr i64, ptr %pool, i64 2
  %bi = load i64, ptr %bp
  %blocks = inttoptr i64 %bi to ptr
  %np = getelementptr i64, ptr %pool, i64 3
  %n = load i64, ptr %np
  br label %next
next:
  %i = atomicrmw add ptr %pool, i64 1 seq_cst
  %more = icmp slt i64 %i, %n
  br i1 %more, label %call, label %done
call:
  %off = mul i64 %i, {MAX_ARGS}
  %blk = getelementptr i64, ptr %blocks, i64 %off
{_LOADS}
  call void %fn({_CALL_ARGS})
  br label %next
done:
  ret void
}}

define internal ptr @line(ptr %pool, i64 %w) {{
  %off = mul i64 %w, {_LINE}
  %off1 = add i64 %off, {_HEADER}
  %p = getelementptr i64, ptr %pool, i64 %off1
  ret ptr %p
}}

define internal void @worker(ptr %pool, i64 %w) {{
entry:
  %me = call ptr @line(ptr %pool, i64 %w)
  %donep = getelementptr i64, ptr %me, i64 1
  %sleepp = getelementptr i64, ptr %me, i64 2
  %stopp = getelementptr i64, ptr %pool, i64 4
  %sysp = getelementptr i64, ptr %pool, i64 5
  %spinp = getelementptr i64, ptr %pool, i64 6
  br label %idle
idle:
  ; a worker starts from seq 0, not from what it reads on entry: a run may have been posted
  ; before this thread got going (its seq is already 1 then, and must not count as seen)
  %seen = phi i64 [ 0, %entry ], [ %seen, %slept ], [ %s, %ran ]
  %t0 = call i64 @llvm.readcyclecounter()
  br label %spin
spin:
  %cur = load atomic i64, ptr %me acquire, align 8
  %new = icmp ne i64 %cur, %seen
  br i1 %new, label %run, label %still
still:
  %stop = load atomic i64, ptr %stopp acquire, align 8
  %stopping = icmp ne i64 %stop, 0
  br i1 %stopping, label %exit, label %pause
pause:
  call void @llvm.x86.sse2.pause()
  %t = call i64 @llvm.readcyclecounter()
  %dt = sub i64 %t, %t0
  %limit = load i64, ptr %spinp
  %long = icmp ugt i64 %dt, %limit
  br i1 %long, label %sleep, label %spin
sleep:
  store atomic i64 1, ptr %sleepp seq_cst, align 8
  %cur2 = load atomic i64, ptr %me seq_cst, align 8
  %same = icmp eq i64 %cur2, %seen
  br i1 %same, label %wait, label %woke
wait:
  %sysi = load i64, ptr %sysp
  %sys = inttoptr i64 %sysi to ptr
  %seen32 = and i64 %seen, 4294967295
  %r = call i64 (i64, ...) %sys(i64 {SYS_FUTEX}, ptr %me, i64 {FUTEX_WAIT_PRIVATE}, i64 %seen32, ptr null)
  br label %woke
woke:
  store atomic i64 0, ptr %sleepp seq_cst, align 8
  br label %slept
slept:
  br label %idle
run:
  %s = phi i64 [ %cur, %spin ]
  call void @drain(ptr %pool)
  store atomic i64 %s, ptr %donep release, align 8
  br label %ran
ran:
  br label %idle
exit:
  ret void
}}

define internal void @run(ptr %pool, i64 %workers) {{
entry:
  %sysp = getelementptr i64, ptr %pool, i64 5
  %sysi = load i64, ptr %sysp
  %sys = inttoptr i64 %sysi to ptr
  br label %post
post:
  %w = phi i64 [ 0, %entry ], [ %w1, %posted ]
  %more = icmp slt i64 %w, %workers
  br i1 %more, label %post1, label %drain
post1:
  %me = call ptr @line(ptr %pool, i64 %w)
  %seq = load i64, ptr %me
  %seq1 = add i64 %seq, 1
  store atomic i64 %seq1, ptr %me seq_cst, align 8
  %sleepp = getelementptr i64, ptr %me, i64 2
  %sleeping = load atomic i64, ptr %sleepp seq_cst, align 8
  %asleep = icmp ne i64 %sleeping, 0
  br i1 %asleep, label %wake, label %posted
wake:
  %r = call i64 (i64, ...) %sys(i64 {SYS_FUTEX}, ptr %me, i64 {FUTEX_WAKE_PRIVATE}, i64 1)
  br label %posted
posted:
  %w1 = add i64 %w, 1
  br label %post
drain:
  call void @drain(ptr %pool)
  br label %join
join:
  %v = phi i64 [ 0, %drain ], [ %v1, %joined ]
  %jmore = icmp slt i64 %v, %workers
  br i1 %jmore, label %join1, label %exit
join1:
  %line = call ptr @line(ptr %pool, i64 %v)
  %want = load i64, ptr %line
  %donep = getelementptr i64, ptr %line, i64 1
  br label %jspin
jspin:
  %d = load atomic i64, ptr %donep acquire, align 8
  %ok = icmp eq i64 %d, %want
  br i1 %ok, label %joined, label %jpause
jpause:
  call void @llvm.x86.sse2.pause()
  br label %jspin
joined:
  %v1 = add i64 %v, 1
  br label %join
exit:
  ret void
}}

define void @"{{symbol}}"(i64 %op, ptr %pool, i64 %w) {{
entry:
  %is_worker = icmp eq i64 %op, 0
  br i1 %is_worker, label %wk, label %rn
wk:
  call void @worker(ptr %pool, i64 %w)
  ret void
rn:
  call void @run(ptr %pool, i64 %w)
  ret void
}}
"""


class NativePool:
    """`workers` native threads plus the caller; see the module docstring."""

    max_args = MAX_ARGS

    def __init__(self, entry: int, workers: int, spin_us: float = SPIN_US):
        self.workers = workers
        self._entry = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)(entry)
        words = _HEADER + _LINE * workers
        raw = np.zeros(words + 8, np.int64)         # aligned to a cache line below
        start = (-raw.ctypes.data % 64) // 8
        self._raw = raw
        self.ctl = raw[start:start + words]
        self._ctl_addr = self.ctl.ctypes.data
        libc = ctypes.CDLL(None, use_errno=True)
        self.ctl[5] = ctypes.cast(libc.syscall, ctypes.c_void_p).value
        self.ctl[6] = int(spin_us * _tsc_per_us())
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._entry, args=(0, self._ctl_addr, w), daemon=True,
                                          name=f"dq-native-{w}") for w in range(workers)]
        for t in self._threads:
            t.start()

    def run(self, fn: int, calls: list[tuple], threads: int | None = None) -> None:
        """fn(*args) for every args in `calls` (tuples of one length), on the workers and the
        calling thread (at most `threads` threads in all)."""
        blocks = np.zeros((len(calls), MAX_ARGS), np.int64)
        blocks[:, :len(calls[0])] = calls
        self.run_blocks(fn, blocks, threads)

    def run_ranges(self, fn: int, ranges: list[tuple[int, int]], tail: tuple,
                   threads: int | None = None) -> None:
        """fn(lo, hi, *tail) for every (lo, hi) in `ranges` (the kernels' common shape: a few
        numpy stores instead of one Python tuple per chunk)."""
        blocks = np.empty((len(ranges), MAX_ARGS), np.int64)
        blocks[:, 2:2 + len(tail)] = tail
        blocks[:, :2] = ranges
        self.run_blocks(fn, blocks, threads)

    def run_blocks(self, fn: int, blocks: np.ndarray, threads: int | None = None) -> None:
        """The calls' arguments as rows of an (n, MAX_ARGS) int64 array."""
        n = len(blocks)
        if blocks.dtype != np.int64 or blocks.shape[1:] != (MAX_ARGS,) or not blocks.flags.c_contiguous:
            raise ValueError(f"blocks must be a C-contiguous (n, {MAX_ARGS}) int64 array")
        if n == 0:
            return
        helpers = min(self.workers, n - 1, (threads or n) - 1)
        with self._lock:           # one run at a time: the counter and the task are shared
            ctl = self.ctl
            ctl[0] = 0
            ctl[1] = fn
            ctl[2] = blocks.ctypes.data
            ctl[3] = n
            self._entry(1, self._ctl_addr, max(0, helpers))

    def close(self) -> None:
        """Stop the workers: set `stop`, then post an empty run so that sleepers wake."""
        with self._lock:
            self.ctl[0] = self.ctl[3] = 0
            self.ctl[4] = 1
            self._entry(1, self._ctl_addr, self.workers)
        for t in self._threads:
            t.join(timeout=1.0)


def _tsc_per_us() -> float:
    """TSC ticks per microsecond (the spin budget is measured with rdtsc)."""
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


def entry_address() -> int:
    """Address of the compiled pool function (compiled once, cached like every kernel)."""
    from types import SimpleNamespace

    from .cpu_runtime import _JIT
    symbol = "dq_pool_" + hashlib.sha256(POOL_IR.encode()).hexdigest()[:16]
    return _JIT.address(SimpleNamespace(text=POOL_IR.replace("{symbol}", symbol), symbol=symbol))


def native_pool() -> NativePool | None:
    """The process's native pool (usable CPUs - 1 workers), started on first use; None where
    it is unsupported or there is one CPU only."""
    global _POOL
    if _POOL is None:
        from .cpu_runtime import usable_cpus
        with _POOL_LOCK:
            if _POOL is None and supported() and usable_cpus() > 1:
                _POOL = NativePool(entry_address(), usable_cpus() - 1)
                atexit.register(_POOL.close)
    return _POOL


def _forget_after_fork() -> None:
    global _POOL
    _POOL = None      # the child has no worker threads; it starts its own pool on first use


os.register_at_fork(after_in_child=_forget_after_fork)
