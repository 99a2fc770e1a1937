"""Native worker threads for parallel kernels: they spin (then sleep on a futex) in compiled
code, outside the GIL, so a kernel launch reaches the other cores in well under a microsecond
instead of the 15-60 us a Python thread-pool wake-up costs on this VM.

    >>> pool = native_pool()                     # None where unsupported or with one CPU
    >>> pool.run(fn_address, [(lo, hi, *ptrs), ...])   # every tuple once, on all cores

`run` calls `fn(*args)` for each argument tuple (integers and pointers, at most MAX_ARGS
each). The kernels' parameters are all integers or pointers, so on the SysV x86-64 ABI a call
through `void (*)(i64 x MAX_ARGS)` passes them correctly (an i32 parameter reads the low half
of its slot; surplus arguments are ignored by the callee).

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
import hashlib
import os
import platform
import threading
import time
import weakref

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

_LOADS = "\n".join(
    f"  %p{i} = getelementptr i64, ptr %blk, i64 {i}\n  %a{i} = load i64, ptr %p{i}"
    for i in range(MAX_ARGS)
)
_CALL_ARGS = ", ".join(f"i64 %a{i}" for i in range(MAX_ARGS))


def _words(names: dict[str, int], base: str = "%pool") -> str:
    """IR lines defining %name = pointer to word `index` of `base`."""
    return "\n".join(f"  %{k} = getelementptr i64, ptr {base}, i64 {v}" for k, v in names.items())


# One entry function; `op` selects: 0 = worker loop of worker a (returns or parks on `stop`),
# 1 = run fn a on blocks b (c of them) with at most d helpers, 2 = stop with mode a,
# 3 = run fn a on blocks b (c of them) on the calling thread alone (touches no shared word),
# 4 = make the BLAS callback (`{symbol}_blas`) run on this pool and store its address in BLAS_CB,
# 5 / 6 = take / release the BLAS callback's mutex (around a fork: blas_threads.py).
POOL_IR = f"""
declare void @llvm.x86.sse2.pause()
declare i64 @llvm.readcyclecounter()

define internal void @futex(ptr %pool, ptr %addr, i64 %op, i64 %val, ptr %ts) {{
{_words(dict(sysp=SYSCALL))}
  %si = load i64, ptr %sysp
  %sys = inttoptr i64 %si to ptr
  %r = call i64 (i64, ...) %sys(i64 {SYS_FUTEX}, ptr %addr, i64 %op, i64 %val, ptr %ts)
  ret void
}}

define internal void @call_block(ptr %fn, ptr %blocks, i64 %i) {{
  %off = mul i64 %i, {MAX_ARGS}
  %blk = getelementptr i64, ptr %blocks, i64 %off
{_LOADS}
  call void %fn({_CALL_ARGS})
  ret void
}}

; Claim the next chunk of the current run and run it: 1 ran one, 2 lost a race (try again),
; 0 nothing left (every chunk claimed, or no run open). `n` is read after `state`: the run
; stores n before publishing (gen, 0), so it is this generation's n or a later one's, and
; then the CAS from this (gen, i) fails (see the module docstring).
define internal i64 @claim(ptr %pool) {{
entry:
{_words(dict(np=N, fnp=FN, bp=BLOCKS))}
  %s = load atomic i64, ptr %pool seq_cst, align 8
  %i = and i64 %s, {CLOSED}
  %n = load atomic i64, ptr %np seq_cst, align 8
  %left = icmp ult i64 %i, %n
  br i1 %left, label %try, label %none
try:
  %s1 = add i64 %s, 1
  %r = cmpxchg ptr %pool, i64 %s, i64 %s1 seq_cst seq_cst
  %ok = extractvalue {{ i64, i1 }} %r, 1
  br i1 %ok, label %call, label %lost
call:
  %fni = load atomic i64, ptr %fnp monotonic, align 8
  %fn = inttoptr i64 %fni to ptr
  %bi = load atomic i64, ptr %bp monotonic, align 8
  %blocks = inttoptr i64 %bi to ptr
  call void @call_block(ptr %fn, ptr %blocks, i64 %i)
  ret i64 1
lost:
  ret i64 2
none:
  ret i64 0
}}

define internal void @worker(ptr %pool, i64 %w) {{
entry:
  %lo = mul i64 %w, {_LINE}
  %lo1 = add i64 %lo, {_HEADER}
  %me = getelementptr i64, ptr %pool, i64 %lo1
{_words(dict(statusp=W_STATUS, budgetp=W_BUDGET, preemp=W_PREEMPTED, parkp=W_PARK), "%me")}
{
    _words(
        dict(
            wakep=WAKE,
            sleepersp=SLEEPERS,
            stopp=STOP,
            helpersp=HELPERS,
            donep=DONE,
            waitingp=CALLER_WAITING,
            spinp=SPIN,
            gapp=GAP,
            minp=MIN_SPIN,
            restp=REST,
        )
    )
}
  %max = load i64, ptr %spinp
  %gap = load i64, ptr %gapp
  %min = load i64, ptr %minp
  br label %top
top:
  %stop = load atomic i64, ptr %stopp seq_cst, align 8
  %stopping = icmp ne i64 %stop, 0
  br i1 %stopping, label %halt, label %look
look:
  ; `wake` is read before `state`: a run published after this read changes `wake` too
  %w0 = load atomic i64, ptr %wakep seq_cst, align 8
  %h = load atomic i64, ptr %helpersp seq_cst, align 8
  %wanted = icmp slt i64 %w, %h
  br i1 %wanted, label %try, label %idle
try:
  %r = call i64 @claim(ptr %pool)
  switch i64 %r, label %idle [ i64 1, label %ran
                               i64 2, label %top ]
ran:
  %d = atomicrmw add ptr %donep, i64 1 seq_cst
  %c = load atomic i64, ptr %me monotonic, align 8
  %c1 = add i64 %c, 1
  store atomic i64 %c1, ptr %me monotonic, align 8
  %wt = load atomic i64, ptr %waitingp seq_cst, align 8
  %waiting = icmp ne i64 %wt, 0
  br i1 %waiting, label %wakecaller, label %top
wakecaller:
  call void @futex(ptr %pool, ptr %donep, i64 {FUTEX_WAKE_PRIVATE}, i64 1, ptr null)
  br label %top
idle:
  %t0 = call i64 @llvm.readcyclecounter()
  %b = load atomic i64, ptr %budgetp monotonic, align 8
  br label %spin
spin:
  %tprev = phi i64 [ %t0, %idle ], [ %t, %spin3 ]
  %cur = load atomic i64, ptr %wakep seq_cst, align 8
  %changed = icmp ne i64 %cur, %w0
  br i1 %changed, label %hit, label %spin1
hit:
  ; spinning paid off: allow longer spins again, slowly (halved at once when descheduled)
  %bq = lshr i64 %b, 4
  %bq1 = add i64 %bq, 1
  %b2 = add i64 %b, %bq1
  %big = icmp ugt i64 %b2, %max
  %b3 = select i1 %big, i64 %max, i64 %b2
  store atomic i64 %b3, ptr %budgetp monotonic, align 8
  br label %top
spin1:
  %st = load atomic i64, ptr %stopp monotonic, align 8
  %st1 = icmp ne i64 %st, 0
  br i1 %st1, label %halt, label %spin1r
spin1r:
  ; the caller's program call has ended (`rest`): the core is the user's code's now (numpy's
  ; BLAS threads, say), so sleep instead of spinning; the next run wakes us
  %rs = load atomic i64, ptr %restp monotonic, align 8
  %resting = icmp ne i64 %rs, 0
  br i1 %resting, label %sleep, label %spin2
spin2:
  call void @llvm.x86.sse2.pause()
  %t = call i64 @llvm.readcyclecounter()
  %step = sub i64 %t, %tprev
  %preempted = icmp ugt i64 %step, %gap
  br i1 %preempted, label %backoff, label %spin3
spin3:
  %dt = sub i64 %t, %t0
  %long = icmp ugt i64 %dt, %b
  br i1 %long, label %sleep, label %spin
backoff:
  ; descheduled while spinning: the core is wanted elsewhere, so spin less and sleep now
  %bh = lshr i64 %b, 1
  %small = icmp ult i64 %bh, %min
  %bn = select i1 %small, i64 %min, i64 %bh
  store atomic i64 %bn, ptr %budgetp monotonic, align 8
  %pc = load atomic i64, ptr %preemp monotonic, align 8
  %pc1 = add i64 %pc, 1
  store atomic i64 %pc1, ptr %preemp monotonic, align 8
  br label %sleep
sleep:
  store atomic i64 1, ptr %statusp monotonic, align 8
  %sl = atomicrmw add ptr %sleepersp, i64 1 seq_cst
  %cur2 = load atomic i64, ptr %wakep seq_cst, align 8
  %st2 = load atomic i64, ptr %stopp seq_cst, align 8
  %same = icmp eq i64 %cur2, %w0
  %go = icmp eq i64 %st2, 0
  %both = and i1 %same, %go
  br i1 %both, label %wait, label %woke
wait:
  %w32 = and i64 %w0, 4294967295
  call void @futex(ptr %pool, ptr %wakep, i64 {FUTEX_WAIT_PRIVATE}, i64 %w32, ptr null)
  br label %woke
woke:
  %sl2 = atomicrmw sub ptr %sleepersp, i64 1 seq_cst
  store atomic i64 0, ptr %statusp monotonic, align 8
  br label %top
halt:
  %sv = load atomic i64, ptr %stopp seq_cst, align 8
  %park = icmp eq i64 %sv, {STOP_PARK}
  br i1 %park, label %parked, label %exit
parked:
  ; never returns: the interpreter may be finalizing (see the module docstring)
  store atomic i64 2, ptr %statusp seq_cst, align 8
  call void @futex(ptr %pool, ptr %parkp, i64 {FUTEX_WAIT_PRIVATE}, i64 0, ptr null)
  br label %parked
exit:
  store atomic i64 3, ptr %statusp seq_cst, align 8
  ret void
}}

define internal void @run(ptr %pool, i64 %fn, i64 %blocks, i64 %n, i64 %helpers) {{
entry:
{
    _words(
        dict(
            fnp=FN,
            bp=BLOCKS,
            np=N,
            hp=HELPERS,
            donep=DONE,
            waitingp=CALLER_WAITING,
            cbp=CALLER_BUDGET,
            spinp=SPIN,
            minp=MIN_SPIN,
            wakep=WAKE,
            sleepersp=SLEEPERS,
            tsp=TIMEOUT_S,
            wtp=WAIT_TICKS,
            wsp=WAITS_SLEPT,
            gapp=GAP,
            restp=REST,
        )
    )
}
  store atomic i64 0, ptr %restp monotonic, align 8
  ; the state is (gen, CLOSED) here: no claim can succeed while the task is replaced
  store atomic i64 %fn, ptr %fnp seq_cst, align 8
  store atomic i64 %blocks, ptr %bp seq_cst, align 8
  store atomic i64 %n, ptr %np seq_cst, align 8
  store atomic i64 %helpers, ptr %hp seq_cst, align 8
  store atomic i64 0, ptr %donep seq_cst, align 8
  %s = load atomic i64, ptr %pool seq_cst, align 8
  %g = lshr i64 %s, 32
  %g1 = add i64 %g, 1
  %s0 = shl i64 %g1, 32
  store atomic i64 %s0, ptr %pool seq_cst, align 8
  %any = icmp sgt i64 %helpers, 0
  br i1 %any, label %post, label %drain
post:
  %old = atomicrmw add ptr %wakep, i64 1 seq_cst
  %sl = load atomic i64, ptr %sleepersp seq_cst, align 8
  %asleep = icmp sgt i64 %sl, 0
  br i1 %asleep, label %wake, label %drain
wake:
  call void @futex(ptr %pool, ptr %wakep, i64 {FUTEX_WAKE_PRIVATE}, i64 %helpers, ptr null)
  br label %drain
drain:
  %mine = phi i64 [ 0, %entry ], [ 0, %post ], [ 0, %wake ], [ %mine1, %again ]
  %r = call i64 @claim(ptr %pool)
  %none = icmp eq i64 %r, 0
  br i1 %none, label %close, label %again
again:
  %got = icmp eq i64 %r, 1
  %inc = zext i1 %got to i64
  %mine1 = add i64 %mine, %inc
  br label %drain
close:
  %sc = or i64 %s0, {CLOSED}
  store atomic i64 %sc, ptr %pool seq_cst, align 8
  %want = sub i64 %n, %mine
  %t0 = call i64 @llvm.readcyclecounter()
  %budget = load atomic i64, ptr %cbp monotonic, align 8
  %gap = load i64, ptr %gapp
  br label %wait
wait:
  %overran = phi i1 [ false, %close ], [ %overran, %wait2 ], [ true, %slept ]
  %tprev = phi i64 [ %t0, %close ], [ %t, %wait2 ], [ %t0, %slept ]
  %d = load atomic i64, ptr %donep seq_cst, align 8
  %fin = icmp eq i64 %d, %want
  br i1 %fin, label %finished, label %wait1
wait1:
  call void @llvm.x86.sse2.pause()
  %t = call i64 @llvm.readcyclecounter()
  %dt = sub i64 %t, %t0
  %long = icmp ugt i64 %dt, %budget
  ; descheduled while spinning (perhaps for the very helper we wait for): sleep at once
  %step = sub i64 %t, %tprev
  %preempted = icmp ugt i64 %step, %gap
  %give_up = or i1 %long, %preempted
  br i1 %give_up, label %sleep, label %wait2
wait2:
  br label %wait
sleep:
  ; a claimed chunk is late (its helper may be descheduled): give up this core for a while
  store atomic i64 1, ptr %waitingp seq_cst, align 8
  %d2 = load atomic i64, ptr %donep seq_cst, align 8
  %fin2 = icmp eq i64 %d2, %want
  br i1 %fin2, label %slept, label %fwait
fwait:
  %d32 = and i64 %d2, 4294967295
  call void @futex(ptr %pool, ptr %donep, i64 {FUTEX_WAIT_PRIVATE}, i64 %d32, ptr %tsp)
  br label %slept
slept:
  store atomic i64 0, ptr %waitingp seq_cst, align 8
  br label %wait
finished:
  ; a wait that overran halves the next one's spin; one that did not lets it grow by 1/16
  %max = load i64, ptr %spinp
  %min = load i64, ptr %minp
  %bh = lshr i64 %budget, 1
  %small = icmp ult i64 %bh, %min
  %bl = select i1 %small, i64 %min, i64 %bh
  %bq = lshr i64 %budget, 4
  %bq1 = add i64 %bq, 1
  %b2 = add i64 %budget, %bq1
  %big = icmp ugt i64 %b2, %max
  %bm = select i1 %big, i64 %max, i64 %b2
  %bs = select i1 %overran, i64 %bl, i64 %bm
  store atomic i64 %bs, ptr %cbp monotonic, align 8
  ; counters for pool.caller_stats(): time spent waiting for claimed chunks, waits that slept
  %tend = call i64 @llvm.readcyclecounter()
  %waited = sub i64 %tend, %t0
  %wt0 = load atomic i64, ptr %wtp monotonic, align 8
  %wt1 = add i64 %wt0, %waited
  store atomic i64 %wt1, ptr %wtp monotonic, align 8
  %ws0 = load atomic i64, ptr %wsp monotonic, align 8
  %slept1 = zext i1 %overran to i64
  %ws1 = add i64 %ws0, %slept1
  store atomic i64 %ws1, ptr %wsp monotonic, align 8
  ret void
}}

; Stop takes the pool for good first (waiting out a run in flight, whose jobs may need every
; worker: OpenBLAS's do), so no run starts on workers that are about to go; later runs find
; it owned and run alone (ours) or on threads of their own (OpenBLAS's).
define internal void @stop(ptr %pool, i64 %mode) {{
entry:
{_words(dict(stopp=STOP, wakep=WAKE))}
  br label %take
take:
  %mine = call i1 @own(ptr %pool)
  br i1 %mine, label %taken, label %busy
busy:
  call void @llvm.x86.sse2.pause()
  br label %take
taken:
  store atomic i64 %mode, ptr %stopp seq_cst, align 8
  %old = atomicrmw add ptr %wakep, i64 1 seq_cst
  call void @futex(ptr %pool, ptr %wakep, i64 {FUTEX_WAKE_PRIVATE}, i64 2147483647, ptr null)
  ret void
}}

define internal void @alone(i64 %fn, i64 %blocks, i64 %n) {{
entry:
  %f = inttoptr i64 %fn to ptr
  %b = inttoptr i64 %blocks to ptr
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %body ]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %body, label %exit
body:
  call void @call_block(ptr %f, ptr %b, i64 %i)
  %i1 = add i64 %i, 1
  br label %loop
exit:
  ret void
}}

; One run owns the shared task at a time: `owner` goes 0 -> 1 for it (a compare-and-swap, so
; that Python's runs and OpenBLAS's, which come from C without the GIL, exclude each other).
define internal i1 @own(ptr %pool) {{
{_words(dict(ownp=OWNER))}
  %r = cmpxchg ptr %ownp, i64 0, i64 1 seq_cst seq_cst
  %ok = extractvalue {{ i64, i1 }} %r, 1
  ret i1 %ok
}}

define internal void @disown(ptr %pool) {{
{_words(dict(ownp=OWNER))}
  store atomic i64 0, ptr %ownp seq_cst, align 8
  ret void
}}

@blas_pool = internal global ptr null

; A futex mutex (Drepper, "Futexes are tricky", mutex 2): 0 free, 1 taken, 2 taken and waited for.
define internal void @lock(ptr %pool, ptr %m) {{
entry:
  %r = cmpxchg ptr %m, i64 0, i64 1 seq_cst seq_cst
  %ok = extractvalue {{ i64, i1 }} %r, 1
  br i1 %ok, label %done, label %contended
contended:
  %c0 = extractvalue {{ i64, i1 }} %r, 0
  br label %loop
loop:
  %c = phi i64 [ %c0, %contended ], [ %c3, %retry ]
  %two = icmp eq i64 %c, 2
  br i1 %two, label %sleep, label %mark
mark:
  %r2 = cmpxchg ptr %m, i64 1, i64 2 seq_cst seq_cst
  %was = extractvalue {{ i64, i1 }} %r2, 0
  %freed = icmp eq i64 %was, 0
  br i1 %freed, label %retry, label %sleep
sleep:
  call void @futex(ptr %pool, ptr %m, i64 {FUTEX_WAIT_PRIVATE}, i64 2, ptr null)
  br label %retry
retry:
  %r3 = cmpxchg ptr %m, i64 0, i64 2 seq_cst seq_cst
  %c3 = extractvalue {{ i64, i1 }} %r3, 0
  %got = extractvalue {{ i64, i1 }} %r3, 1
  br i1 %got, label %done, label %loop
done:
  ret void
}}

define internal void @unlock(ptr %pool, ptr %m) {{
entry:
  %old = atomicrmw sub ptr %m, i64 1 seq_cst
  %alone = icmp eq i64 %old, 1
  br i1 %alone, label %done, label %wake
wake:
  store atomic i64 0, ptr %m seq_cst, align 8
  call void @futex(ptr %pool, ptr %m, i64 {FUTEX_WAKE_PRIVATE}, i64 1, ptr null)
  br label %done
done:
  ret void
}}

; A job of OpenBLAS's on a thread of its own: row = (i, job data, buffer index, dojob).
define internal ptr @blas_thread(ptr %row) {{
  %p1 = getelementptr i64, ptr %row, i64 1
  %p2 = getelementptr i64, ptr %row, i64 2
  %p3 = getelementptr i64, ptr %row, i64 3
  %a0 = load i64, ptr %row
  %a1 = load i64, ptr %p1
  %a2 = load i64, ptr %p2
  %fi = load i64, ptr %p3
  %f = inttoptr i64 %fi to ptr
  call void %f(i64 %a0, i64 %a1, i64 %a2)
  ret ptr null
}}

; OpenBLAS's caller-managed threading (openblas_set_threads_callback_function): run
; dojob(i, jobdata + i * elsize, data) for i < numjobs, ALL AT ONCE, and return when every job
; is done. The jobs of a level-3 call wait for each other's packed panels, so each needs a
; thread of its own: on the pool when it is free and has numjobs - 1 workers, else job 0 here
; and the others on threads made for them (pthread_create; a nested or concurrent call).
define void @"{{symbol}}_blas"(i32 %sync, ptr %dojob, i32 %numjobs, i64 %elsize, ptr %jobdata, i32 %data) {{
entry:
  %pool = load ptr, ptr @blas_pool
  %n = sext i32 %numjobs to i64
  %few = icmp slt i64 %n, 1
  br i1 %few, label %done, label %start
start:
  %dd = sext i32 %data to i64
  %jd = ptrtoint ptr %jobdata to i64
  %fn = ptrtoint ptr %dojob to i64
  %cells = mul i64 %n, {MAX_ARGS}
  %blocks = alloca i64, i64 %cells, align 16
  br label %fill
fill:
  %i = phi i64 [ 0, %start ], [ %i1, %fill ]
  %at = mul i64 %i, {MAX_ARGS}
  %q0 = getelementptr i64, ptr %blocks, i64 %at
  %q1 = getelementptr i64, ptr %q0, i64 1
  %q2 = getelementptr i64, ptr %q0, i64 2
  %q3 = getelementptr i64, ptr %q0, i64 3
  %off = mul i64 %i, %elsize
  %job = add i64 %jd, %off
  store i64 %i, ptr %q0
  store i64 %job, ptr %q1
  store i64 %dd, ptr %q2
  store i64 %fn, ptr %q3
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %n
  br i1 %more, label %fill, label %filled
filled:
{
    _words(
        dict(
            workersp=WORKERS,
            stopp=STOP,
            pcp=PTHREAD_CREATE,
            pjp=PTHREAD_JOIN,
            pooledp=BLAS_POOLED,
            threadedp=BLAS_THREADED,
            mutexp=BLAS_LOCK,
        )
    )
}
  ; OpenBLAS hands each job its buffers by thread number (0 .. numjobs-1), the same numbers
  ; for every call: two calls at once (an sgemm and a dgemm from two Python threads, which
  ; OpenBLAS's own server would queue) would pack into the same buffers. One at a time.
  call void @lock(ptr %pool, ptr %mutexp)
  %workers = load atomic i64, ptr %workersp monotonic, align 8
  %need = sub i64 %n, 1
  %fits = icmp sle i64 %need, %workers
  %stop = load atomic i64, ptr %stopp seq_cst, align 8
  %live = icmp eq i64 %stop, 0
  %usable = and i1 %fits, %live
  br i1 %usable, label %try, label %threads
try:
  %mine = call i1 @own(ptr %pool)
  br i1 %mine, label %pooled, label %threads
pooled:
  %np0 = atomicrmw add ptr %pooledp, i64 1 monotonic
  %bi = ptrtoint ptr %blocks to i64
  call void @run(ptr %pool, i64 %fn, i64 %bi, i64 %n, i64 %need)
  call void @disown(ptr %pool)
  br label %finished
threads:
  %nt0 = atomicrmw add ptr %threadedp, i64 1 monotonic
  %tids = alloca i64, i64 %n, align 8
  %pci = load i64, ptr %pcp
  %pc = inttoptr i64 %pci to ptr
  %pji = load i64, ptr %pjp
  %pj = inttoptr i64 %pji to ptr
  br label %spawn
spawn:
  %j = phi i64 [ 1, %threads ], [ %j1, %spawned ]
  %go = icmp slt i64 %j, %n
  br i1 %go, label %make, label %here
make:
  %jat = mul i64 %j, {MAX_ARGS}
  %row = getelementptr i64, ptr %blocks, i64 %jat
  %tid = getelementptr i64, ptr %tids, i64 %j
  br label %create
create:
  %rc = call i32 %pc(ptr %tid, ptr null, ptr @blas_thread, ptr %row)
  %made = icmp eq i32 %rc, 0
  ; EAGAIN (threads exhausted for the moment): try again; a job run here instead would wait
  ; for the others forever
  br i1 %made, label %spawned, label %create
spawned:
  %j1 = add i64 %j, 1
  br label %spawn
here:
  call ptr @blas_thread(ptr %blocks)
  br label %join
join:
  %k = phi i64 [ 1, %here ], [ %k1, %joined ]
  %jn = icmp slt i64 %k, %n
  br i1 %jn, label %wait, label %finished
wait:
  %tk = getelementptr i64, ptr %tids, i64 %k
  %t = load i64, ptr %tk
  %jr = call i32 %pj(i64 %t, ptr null)
  br label %joined
joined:
  %k1 = add i64 %k, 1
  br label %join
finished:
  call void @unlock(ptr %pool, ptr %mutexp)
  br label %done
done:
  ret void
}}

define void @"{{symbol}}"(i64 %op, ptr %pool, i64 %a, i64 %b, i64 %c, i64 %d) {{
entry:
  switch i64 %op, label %alone [ i64 0, label %wk
                                 i64 1, label %rn
                                 i64 2, label %st
                                 i64 4, label %blas
                                 i64 5, label %bl
                                 i64 6, label %bu ]
wk:
  call void @worker(ptr %pool, i64 %a)
  ret void
rn:
  %mine = call i1 @own(ptr %pool)
  br i1 %mine, label %owned, label %alone
owned:
  call void @run(ptr %pool, i64 %a, i64 %b, i64 %c, i64 %d)
  call void @disown(ptr %pool)
  ret void
blas:
  ; OpenBLAS's jobs will run on this pool: remember it, and say where the callback is
  store ptr %pool, ptr @blas_pool
{_words(dict(cbp=BLAS_CB))}
  %cb = ptrtoint ptr @"{{symbol}}_blas" to i64
  store i64 %cb, ptr %cbp
  ret void
bl:
{_words(dict(blp=BLAS_LOCK))}
  call void @lock(ptr %pool, ptr %blp)
  ret void
bu:
{_words(dict(bup=BLAS_LOCK))}
  call void @unlock(ptr %pool, ptr %bup)
  ret void
st:
  call void @stop(ptr %pool, i64 %a)
  ret void
alone:
  call void @alone(i64 %a, i64 %b, i64 %c)
  ret void
}}
"""


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

    symbol = "dq_pool_" + hashlib.sha256(POOL_IR.encode()).hexdigest()[:16]
    return JIT.address(SimpleNamespace(text=POOL_IR.replace("{symbol}", symbol), symbol=symbol))


def running_pool() -> NativePool | None:
    """The process's native pool if one was started, else None (never starts one)."""
    return _POOL


def native_pool() -> NativePool | None:
    """The process's native pool (usable_cpus() - 1 workers), started on first use; None where
    it is unsupported or there is one usable CPU (no helper thread is started then)."""
    global _POOL
    if _POOL is None:
        if not supported() or usable_cpus() < 2:
            return None
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


os.register_at_fork(after_in_child=_after_fork_in_child)
