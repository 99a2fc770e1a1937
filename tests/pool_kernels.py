"""Test kernels for the native pool, in LLVM IR: `count(lo, hi, counts, ticks)` adds 1 to
counts[lo:hi] atomically, then spins `ticks` TSC ticks (a slow chunk). Every index counted
exactly once is what a correct pool gives; a chunk run twice, or a stale task run late,
leaves a 2 (or a 1 in an array that belongs to an earlier run)."""

from __future__ import annotations

from types import SimpleNamespace

from dlvm_eq.codegen.runtime.jit import JIT

_COUNT_IR = """
declare i64 @llvm.readcyclecounter()

define void @dq_test_pool_count_v1(i64 %lo, i64 %hi, ptr %counts, i64 %ticks) {
entry:
  br label %loop
loop:
  %i = phi i64 [ %lo, %entry ], [ %i1, %body ]
  %more = icmp slt i64 %i, %hi
  br i1 %more, label %body, label %slow
body:
  %p = getelementptr i64, ptr %counts, i64 %i
  %old = atomicrmw add ptr %p, i64 1 seq_cst
  %i1 = add i64 %i, 1
  br label %loop
slow:
  %t0 = call i64 @llvm.readcyclecounter()
  br label %spin
spin:
  %t = call i64 @llvm.readcyclecounter()
  %dt = sub i64 %t, %t0
  %go = icmp ult i64 %dt, %ticks
  br i1 %go, label %spin, label %done
done:
  ret void
}
"""


def count_kernel() -> int:
    """Address of the counting kernel."""
    return JIT.address(SimpleNamespace(text=_COUNT_IR, symbol="dq_test_pool_count_v1"))
