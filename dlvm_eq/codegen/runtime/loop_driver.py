"""The native loop driver: one LLVM function that runs every step of a scan, each step a list
of records (planning/loop_plan.py), with no Python between steps.

    drive = loop_driver()          # a ctypes function (it releases the GIL while it runs)
    drive(records, n_records, patches, n_patches, length, reverse)

`records` is an int64 array of n_records rows of WORDS words: [kind, fn, arg 0 .. arg 39].
Kinds: CALL calls fn(arg 0, .., arg 39) as `void (i64 x 40)` (the kernels take integers and
pointers only: on the SysV x86-64 ABI surplus arguments are ignored, an i32 reads the low
half; native_pool.py calls them the same way); SGEMM / DGEMM call CBLAS's ?gemm (64-bit
integers: numpy's OpenBLAS) with alpha 1 and beta 0 from args (order, transa, transb, m, n,
k, a, lda, b, ldb, c, ldc); COPY copies a rows x cols strided block (args: dst, src, rows,
cols, row stride and column stride in bytes, element size) into a contiguous dst: a row at a
time where its elements are adjacent (memmove: a carry copied onto itself is fine), else
element by element.

`patches` (n_patches rows of [record, word, base, stride]) are the arguments that move with
the step: before step t, records[record][word] = base + t' * stride (t' = length - 1 - t when
`reverse`): the slices of xs the body reads and the rows of ys it writes.
"""

from __future__ import annotations

import ctypes
import threading
from types import SimpleNamespace

CALL, SGEMM, DGEMM, COPY = 0, 1, 2, 3  # record kinds (the driver's switch)
MAX_ARGS = 40  # integer or pointer arguments of a CALL record
WORDS = 2 + MAX_ARGS
SYMBOL = "dq_loop_driver"

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
define void @{SYMBOL}(ptr %recs, i64 %nrec, ptr %patch, i64 %npatch, i64 %len, i64 %rev) {{
entry:
  br label %tloop
tloop:
  %t = phi i64 [0, %entry], [%t1, %tnext]
  %more = icmp slt i64 %t, %len
  br i1 %more, label %tbody, label %done
tbody:
  %last = sub i64 %len, 1
  %back = sub i64 %last, %t
  %isrev = icmp ne i64 %rev, 0
  %tt = select i1 %isrev, i64 %back, i64 %t
  br label %ploop
ploop:
  %p = phi i64 [0, %tbody], [%p1, %pbody]
  %pmore = icmp slt i64 %p, %npatch
  br i1 %pmore, label %pbody, label %rloop
pbody:
  %q = mul i64 %p, 4
  %q0 = getelementptr i64, ptr %patch, i64 %q
  %prec = load i64, ptr %q0
  %q1 = getelementptr i64, ptr %q0, i64 1
  %pword = load i64, ptr %q1
  %q2 = getelementptr i64, ptr %q0, i64 2
  %pbase = load i64, ptr %q2
  %q3 = getelementptr i64, ptr %q0, i64 3
  %pstride = load i64, ptr %q3
  %off = mul i64 %tt, %pstride
  %val = add i64 %pbase, %off
  %w0 = mul i64 %prec, {WORDS}
  %w = add i64 %w0, %pword
  %dst = getelementptr i64, ptr %recs, i64 %w
  store i64 %val, ptr %dst
  %p1 = add i64 %p, 1
  br label %ploop
rloop:
  %r = phi i64 [0, %ploop], [%r1, %rnext]
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
                                   i64 {COPY}, label %kcopy ]
kcall:
  call void %fn({ints})
  br label %rnext
ksgemm:
  call void %fn({gemm.format(t="float", one="1.0")})
  br label %rnext
kdgemm:
  call void %fn({gemm.format(t="double", one="1.0")})
  br label %rnext
kcopy:
  %dstp = inttoptr i64 %a0 to ptr
  %srcp = inttoptr i64 %a1 to ptr
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
  %fd0 = mul i64 %i, %a3
  %fd = mul i64 %fd0, %a6
  %fn0 = mul i64 %a3, %a6
  %fsp = getelementptr i8, ptr %srcp, i64 %fs
  %fdp = getelementptr i8, ptr %dstp, i64 %fd
  call void @llvm.memmove.p0.p0.i64(ptr %fdp, ptr %fsp, i64 %fn0, i1 false)
  br label %crownext
ccol:
  %j = phi i64 [0, %crowkind], [%j1, %celem]
  %jmore = icmp slt i64 %j, %a3
  br i1 %jmore, label %celem, label %crownext
celem:
  %si0 = mul i64 %i, %a4
  %si1 = mul i64 %j, %a5
  %si = add i64 %si0, %si1
  %di0 = mul i64 %i, %a3
  %di1 = add i64 %di0, %j
  %di = mul i64 %di1, %a6
  %sp = getelementptr i8, ptr %srcp, i64 %si
  %dp = getelementptr i8, ptr %dstp, i64 %di
  call void @llvm.memcpy.p0.p0.i64(ptr %dp, ptr %sp, i64 %a6, i1 false)
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
  br label %tloop
done:
  ret void
}}

declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)
declare void @llvm.memmove.p0.p0.i64(ptr, ptr, i64, i1)
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
                ctypes.c_int64,
                ctypes.c_int64,
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
    "CALL",
    "COPY",
    "DGEMM",
    "MAX_ARGS",
    "SGEMM",
    "WORDS",
    "gemm_address",
    "loop_driver",
]
