"""The native loop driver: one LLVM function that runs the steps of a loop, each step a list of
records (planning/loop_plan.py), with no Python between steps.

    drive = loop_driver()          # a ctypes function (it releases the GIL while it runs)
    state = np.array([0, length, reverse, budget, 0, 0], np.int64)
    drive(records, n_records, patches, n_patches, state.ctypes.data)   # until state[0] == length

`records` is an int64 array of n_records rows of WORDS words: [kind, fn, arg 0 .. arg 39].
Kinds: CALL calls fn(arg 0, .., arg 39) as `void (i64 x 40)` (the kernels take integers and
pointers only: on the SysV x86-64 ABI surplus arguments are ignored, an i32 reads the low
half; native_pool.py calls them the same way); SGEMM / DGEMM call CBLAS's ?gemm (64-bit
integers: numpy's OpenBLAS) with alpha 1 and beta 0 from args (order, transa, transb, m, n,
k, a, lda, b, ldb, c, ldc); COPY copies a rows x cols strided block (args: dst, src, rows,
cols, row stride and column stride in bytes, element size, dst's row stride in bytes: 0 for
cols * element size) into dst's rows of adjacent elements (a concatenation's part): a row at a
time where its elements are adjacent (memmove: a carry copied onto itself is fine), else
element by element (a load and a store for 4- and 8-byte elements: a memcpy call each made
the LSTM's 16 x 256 transposed residual cost 10 us a step); BREAK ends the loop, before the
records after it run (state[4] = 1 then), when the bool byte at arg 0 is arg 1 (0: a while
loop's test is false; a cond's branch runs as a one-step loop that breaks unless it is the
branch taken); PICK ends it the same way unless the i32 at arg 0, clamped to [0, arg 2], is
arg 1 (a switch's branch i of arg 2 + 1); LOOP runs an inner loop: the driver itself on the
table (records, n_records, patches, n_patches, state) in args 0-4, with this call's budget.

`patches` (n_patches rows of [address, base, stride, mode]) are the words that move with the
step: before step t, the int64 at `address` (in a record, or in a block of arguments the
records point to) becomes base + i * stride, where i = t' (mode 0; t' = length - 1 - t when
`reverse`: the slices of xs the body reads and the rows of ys it writes) or i = t % 2 (mode 1:
a carry and its result swapped between two buffers every step).

`state` = [t, length, reverse, budget, broke, r]. The driver runs from step state[0] (from its
record r, then r = 0) and stores where it stopped there: at `length`, at a BREAK, after the
first step that ends more than `budget` cycles (the CPU's cycle counter; 0: no budget) after
the call began, or inside a step, at a LOOP record whose inner loop stopped so (its record
index in r: the next call runs that inner loop on from where it stopped, then the rest of the
step). The caller calls again until the loop is done, so that Python handles a signal
(Ctrl-C) between the calls, within about `budget` cycles per level of nesting, with every
buffer in a consistent state.
"""

from __future__ import annotations

import ctypes
import threading
from types import SimpleNamespace

CALL, SGEMM, DGEMM, COPY, BREAK, PICK, LOOP = 0, 1, 2, 3, 4, 5, 6  # record kinds (its switch)
STATE_WORDS = 6  # [t, length, reverse, budget, broke, record to resume at]
# About 10 ms between returns to Python at 3 GHz: the latency of Ctrl-C in a native loop, and
# one ctypes call (about 1 us) per 10 ms of work.
BUDGET_CYCLES = 1 << 25
MAX_ARGS = 40  # integer or pointer arguments of a CALL record
WORDS = 2 + MAX_ARGS
SYMBOL = "dq_loop_driver_v6"  # v1 took (length, reverse) as arguments; v2's BREAK had no arg 1;
# v3 copied a strided element with a memcpy call; v4 had no PICK, LOOP or resumed step; v5's COPY
# had no dst row stride

_LOCK = threading.Lock()
_DRIVER: list = []
_BLAS: dict = {}


def _ir() -> str:
    loads = "\n".join(
        f"  %ap{i} = getelementptr i64, ptr %rp, i64 {2 + i}\n  %a{i} = load i64, ptr %ap{i}"
        for i in range(MAX_ARGS)
    )
    ints = ", ".join(f"i64 %a{i}" for i in range(MAX_ARGS))
    gemm = (
        "i64 %a0, i64 %a1, i64 %a2, i64 %a3, i64 %a4, i64 %a5, {t} {one}, i64 %a6, i64 %a7, "
        "i64 %a8, i64 %a9, {t} 0.0, i64 %a10, i64 %a11"
    )
    return f"""
define void @{SYMBOL}(ptr %recs, i64 %nrec, ptr %patch, i64 %npatch, ptr %state) {{
entry:
  %t0 = load i64, ptr %state
  %lenp = getelementptr i64, ptr %state, i64 1
  %len = load i64, ptr %lenp
  %revp = getelementptr i64, ptr %state, i64 2
  %rev = load i64, ptr %revp
  %budp = getelementptr i64, ptr %state, i64 3
  %budget = load i64, ptr %budp
  %brkp = getelementptr i64, ptr %state, i64 4
  %resp = getelementptr i64, ptr %state, i64 5
  %r0 = load i64, ptr %resp
  store i64 0, ptr %resp
  %isrev = icmp ne i64 %rev, 0
  %hasbudget = icmp sgt i64 %budget, 0
  %c0 = call i64 @llvm.readcyclecounter()
  br label %tloop
tloop:
  %t = phi i64 [%t0, %entry], [%t1, %tnext]
  %rs = phi i64 [%r0, %entry], [0, %tnext]
  %more = icmp slt i64 %t, %len
  br i1 %more, label %tbody, label %done
tbody:
  %last = sub i64 %len, 1
  %back = sub i64 %last, %t
  %tt = select i1 %isrev, i64 %back, i64 %t
  %par = and i64 %t, 1
  br label %ploop
ploop:
  %p = phi i64 [0, %tbody], [%p1, %pbody]
  %pmore = icmp slt i64 %p, %npatch
  br i1 %pmore, label %pbody, label %rloop
pbody:
  %q = mul i64 %p, 4
  %q0 = getelementptr i64, ptr %patch, i64 %q
  %paddr = load i64, ptr %q0
  %q1 = getelementptr i64, ptr %q0, i64 1
  %pbase = load i64, ptr %q1
  %q2 = getelementptr i64, ptr %q0, i64 2
  %pstride = load i64, ptr %q2
  %q3 = getelementptr i64, ptr %q0, i64 3
  %pmode = load i64, ptr %q3
  %alt = icmp ne i64 %pmode, 0
  %pidx = select i1 %alt, i64 %par, i64 %tt
  %off = mul i64 %pidx, %pstride
  %val = add i64 %pbase, %off
  %dst = inttoptr i64 %paddr to ptr
  store i64 %val, ptr %dst
  %p1 = add i64 %p, 1
  br label %ploop
rloop:
  %r = phi i64 [%rs, %ploop], [%r1, %rnext]
  %rmore = icmp slt i64 %r, %nrec
  br i1 %rmore, label %rbody, label %tnext
rbody:
  %ro = mul i64 %r, {WORDS}
  %rp = getelementptr i64, ptr %recs, i64 %ro
  %kind = load i64, ptr %rp
  %fp = getelementptr i64, ptr %rp, i64 1
  %fi = load i64, ptr %fp
  %fn = inttoptr i64 %fi to ptr
{loads}
  switch i64 %kind, label %rnext [ i64 0, label %kcall
                                   i64 {SGEMM}, label %ksgemm
                                   i64 {DGEMM}, label %kdgemm
                                   i64 {COPY}, label %kcopy
                                   i64 {BREAK}, label %kbreak
                                   i64 {PICK}, label %kpick
                                   i64 {LOOP}, label %kloop ]
kcall:
  call void %fn({ints})
  br label %rnext
ksgemm:
  call void %fn({gemm.format(t="float", one="1.0")})
  br label %rnext
kdgemm:
  call void %fn({gemm.format(t="double", one="1.0")})
  br label %rnext
kbreak:
  %bp = inttoptr i64 %a0 to ptr
  %bv = load volatile i8, ptr %bp
  %bset = icmp ne i8 %bv, 0
  %bwhen = icmp ne i64 %a1, 0
  %bz = icmp eq i1 %bset, %bwhen
  br i1 %bz, label %broke, label %rnext
kpick:
  %kp = inttoptr i64 %a0 to ptr
  %kv32 = load volatile i32, ptr %kp
  %kv = sext i32 %kv32 to i64
  %klo = icmp slt i64 %kv, 0
  %kc0 = select i1 %klo, i64 0, i64 %kv
  %khi = icmp sgt i64 %kc0, %a2
  %kc = select i1 %khi, i64 %a2, i64 %kc0
  %keq = icmp eq i64 %kc, %a1
  br i1 %keq, label %rnext, label %broke
kloop:
  %lrecs = inttoptr i64 %a0 to ptr
  %lpatch = inttoptr i64 %a2 to ptr
  %lstate = inttoptr i64 %a4 to ptr
  %lbudp = getelementptr i64, ptr %lstate, i64 3
  store i64 %budget, ptr %lbudp
  call void @{SYMBOL}(ptr %lrecs, i64 %a1, ptr %lpatch, i64 %a3, ptr %lstate)
  %lt = load i64, ptr %lstate
  %llenp = getelementptr i64, ptr %lstate, i64 1
  %llen = load i64, ptr %llenp
  %lbrkp = getelementptr i64, ptr %lstate, i64 4
  %lbrk = load i64, ptr %lbrkp
  %lend = icmp sge i64 %lt, %llen
  %lbroke = icmp ne i64 %lbrk, 0
  %ldone = or i1 %lend, %lbroke
  br i1 %ldone, label %rnext, label %lpause
lpause:
  store i64 %r, ptr %resp
  store i64 %t, ptr %state
  ret void
broke:
  store i64 1, ptr %brkp
  store i64 %t, ptr %state
  ret void
kcopy:
  %dstp = inttoptr i64 %a0 to ptr
  %srcp = inttoptr i64 %a1 to ptr
  %drow0 = mul i64 %a3, %a6
  %drowz = icmp eq i64 %a7, 0
  %drs = select i1 %drowz, i64 %drow0, i64 %a7
  br label %crow
crow:
  %i = phi i64 [0, %kcopy], [%i1, %crownext]
  %imore = icmp slt i64 %i, %a2
  br i1 %imore, label %crowkind, label %rnext
crowkind:
  %dense = icmp eq i64 %a5, %a6
  br i1 %dense, label %crowfast, label %ccol
crowfast:
  %fs = mul i64 %i, %a4
  %fd = mul i64 %i, %drs
  %fn0 = mul i64 %a3, %a6
  %fsp = getelementptr i8, ptr %srcp, i64 %fs
  %fdp = getelementptr i8, ptr %dstp, i64 %fd
  call void @llvm.memmove.p0.p0.i64(ptr %fdp, ptr %fsp, i64 %fn0, i1 false)
  br label %crownext
ccol:
  %j = phi i64 [0, %crowkind], [%j1, %cnext]
  %jmore = icmp slt i64 %j, %a3
  br i1 %jmore, label %celem, label %crownext
celem:
  %si0 = mul i64 %i, %a4
  %si1 = mul i64 %j, %a5
  %si = add i64 %si0, %si1
  %di0 = mul i64 %i, %drs
  %di1 = mul i64 %j, %a6
  %di = add i64 %di0, %di1
  %sp = getelementptr i8, ptr %srcp, i64 %si
  %dp = getelementptr i8, ptr %dstp, i64 %di
  switch i64 %a6, label %cany [ i64 4, label %c4
                                i64 8, label %c8 ]
c4:
  %v4 = load i32, ptr %sp, align 1
  store i32 %v4, ptr %dp, align 1
  br label %cnext
c8:
  %v8 = load i64, ptr %sp, align 1
  store i64 %v8, ptr %dp, align 1
  br label %cnext
cany:
  call void @llvm.memcpy.p0.p0.i64(ptr %dp, ptr %sp, i64 %a6, i1 false)
  br label %cnext
cnext:
  %j1 = add i64 %j, 1
  br label %ccol
crownext:
  %i1 = add i64 %i, 1
  br label %crow
rnext:
  %r1 = add i64 %r, 1
  br label %rloop
tnext:
  %t1 = add i64 %t, 1
  %c1 = call i64 @llvm.readcyclecounter()
  %elapsed = sub i64 %c1, %c0
  %over = icmp ugt i64 %elapsed, %budget
  %stop = and i1 %hasbudget, %over
  br i1 %stop, label %pause, label %tloop
pause:
  store i64 %t1, ptr %state
  ret void
done:
  store i64 %t, ptr %state
  ret void
}}

declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)
declare void @llvm.memmove.p0.p0.i64(ptr, ptr, i64, i1)
declare i64 @llvm.readcyclecounter()
"""


def loop_driver():
    """The driver as a ctypes function (compiled once per process, cached on disk by JIT)."""
    with _LOCK:
        if not _DRIVER:
            from .jit import JIT

            addr = JIT.address(SimpleNamespace(text=_ir(), symbol=SYMBOL))
            proto = ctypes.CFUNCTYPE(
                None,
                ctypes.c_void_p,
                ctypes.c_int64,
                ctypes.c_void_p,
                ctypes.c_int64,
                ctypes.c_void_p,
            )
            _DRIVER.append(proto(addr))  # a CFUNCTYPE call releases the GIL
        return _DRIVER[0]


def gemm_address(dtype: str) -> int | None:
    """The address of CBLAS's sgemm ("f32") or dgemm ("f64") with 64-bit integers in numpy's
    OpenBLAS, None where there is none (the Python driver runs such a loop)."""
    with _LOCK:
        if dtype not in _BLAS:
            from .blas_threads import loaded_openblas

            letter = {"f32": "s", "f64": "d"}[dtype]
            names = [f"scipy_cblas_{letter}gemm64_", f"cblas_{letter}gemm64_"]
            found = None
            for path in loaded_openblas():
                try:
                    lib = ctypes.CDLL(path)  # already loaded: the same handle
                except OSError:
                    continue
                for name in names:
                    if hasattr(lib, name):
                        found = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                        break
                if found:
                    break
            _BLAS[dtype] = found
        return _BLAS[dtype]


__all__ = [
    "BREAK",
    "LOOP",
    "PICK",
    "STATE_WORDS",
    "BUDGET_CYCLES",
    "CALL",
    "COPY",
    "DGEMM",
    "MAX_ARGS",
    "SGEMM",
    "WORDS",
    "gemm_address",
    "loop_driver",
]
