"""A scan run by the native loop driver (runtime/loop_driver.py): the body's compiled program
(a CpuProgram) supplies its kernels and an arena; every step runs in one native call, with no
Python between steps.

    scan = native_scan(body_program, carries=1, xs=1, reverse=False)  # None: not natively
    carries_and_ys = scan(carries, xs, withs, length)

The body's buffers are reused across steps: its temporaries stay in the one arena, its
outputs are one buffer each per call (a carry result is copied into the carry parameter after
each step), its ys are written into their rows of the stacked ys (in place where the body's
output is the y's alone). What cannot run natively (a kernel split over threads, a gather, a
product BLAS cannot read in place: planning/loop_plan.py says which) returns None here and
the scan runs through the Python driver (pipeline/loops.py).

Shared state (threads): a NativeScan is read only after construction; each call builds its
own records array and takes its own arena from the program (as a plain call does); OpenBLAS
runs on one thread while any loop of small products is in flight (a count, under a lock).
"""

from __future__ import annotations

import numpy as np

from ...errors import DlvmError
from ..kernels.spec import DTYPES
from ..planning.loop_plan import CALL, COPY, DGEMM, MAX_ARGS, SGEMM, LoopPlan, Ptr, loop_plan
from ..planning.plan import OUTPUT, PARAM, GemmStep
from ..runtime.attention_cpu import one_blas_thread  # one count shared with attention
from ..runtime.buffers import aligned_empty, data_ptr
from ..runtime.cpu_kernel import compile_cpu
from ..runtime.loop_driver import WORDS, gemm_address, loop_driver

# A loop whose products are all below this many multiply-adds runs them on one OpenBLAS thread
# (runtime/attention_cpu.one_blas_thread); one at or above it keeps OpenBLAS's threads.
THREADED_BLAS_MACS = 1 << 24


class NativeScan:
    def __init__(self, prog, lp: LoopPlan, reverse: bool):
        self.prog, self.plan, self.lp, self.reverse = prog, prog.plan, lp, reverse
        plan = self.plan
        self.template = np.zeros((len(lp.records), WORDS), np.int64)
        self.pointers: list = []  # (record, word, Ptr or ("y", j))
        self._kernels = []  # kept alive: the records hold their addresses and dims arrays
        for r, rec in enumerate(lp.records):
            row = self.template[r]
            row[0] = rec.kind
            args = list(rec.args)
            if rec.kind == CALL:
                what, i = rec.fn
                step = plan.steps[i]
                if what == "epilogue":
                    assert isinstance(step, GemmStep)
                    k = compile_cpu(step.epilogue.spec)
                else:
                    k = prog.kernels[id(step)]
                head = k.one_call_head()
                if head is None:
                    raise _NotNative("a kernel split over threads")
                self._kernels.append(k)
                args = list(head) + args + [k.dims_ptr]
                row[1] = k.address
            elif rec.kind != COPY:
                addr = gemm_address(rec.fn[1])
                if addr is None:
                    raise _NotNative("no CBLAS in this process")
                row[1] = addr
            if len(args) > MAX_ARGS:
                raise _NotNative("a call with too many arguments")
            for w, a in enumerate(args):
                if isinstance(a, (Ptr, tuple)):
                    self.pointers.append((r, 2 + w, a))
                else:
                    row[2 + w] = a
        self.driver = loop_driver()
        macs = [r.args[3] * r.args[4] * r.args[5] for r in lp.records if r.kind in (SGEMM, DGEMM)]
        self.threaded_blas = max(macs, default=0) >= THREADED_BLAS_MACS
        nc, nx = lp.carries, lp.xs
        self.carry_slots = plan.params[:nc]
        self.x_slots = plan.params[nc : nc + nx]
        self.with_slots = plan.params[nc + nx :]
        self.y_slots = [r.slot for r in plan.results[nc:]]
        self.outputs = [s for s in plan.slots if s.role == OUTPUT and s.index not in lp.direct_ys]

    def __call__(self, carries, xs, withs, length: int) -> list:
        plan, n = self.plan, len(self.plan.slots)
        dtype = lambda s: DTYPES[plan.slots[s].dtype]
        shape = lambda s: tuple(plan.slots[s].shape)
        fixed: dict = {}
        moving: dict = {}  # slot -> (base address, bytes per step)
        keep = []
        cs = [
            np.array(c, dtype=dtype(s), order="C", copy=True)
            for s, c in zip(self.carry_slots, carries)
        ]
        for s, c in zip(self.carry_slots, cs):
            _check(c, shape(s), plan, s)
            fixed[s] = data_ptr(c) if c.size else 0
        for s, x in zip(self.x_slots, xs):
            x = np.ascontiguousarray(x, dtype=dtype(s))
            _check(x, (length, *shape(s)), plan, s)
            keep.append(x)
            moving[s] = (data_ptr(x) if x.size else 0, x.strides[0] if x.ndim else 0)
        for s, w in zip(self.with_slots, withs):
            w = np.ascontiguousarray(w, dtype=dtype(s))
            _check(w, shape(s), plan, s)
            keep.append(w)
            fixed[s] = data_ptr(w) if w.size else 0
        ys = [aligned_empty((length, *shape(s)), dtype(s)) for s in self.y_slots]
        ystep = [(data_ptr(y) if y.size else 0, y.strides[0] if y.size else 0) for y in ys]
        for slot, j in self.lp.direct_ys.items():
            moving[slot] = ystep[j]
        for s in self.outputs:
            buf = aligned_empty(s.shape, DTYPES[s.dtype])
            keep.append(buf)
            fixed[s.index] = data_ptr(buf)
        env = self.prog.take_arena()
        try:
            records = self.template.copy()
            patches = []
            for r, w, a in self.pointers:
                if isinstance(a, tuple):  # ("y", j): a row of the stacked ys
                    base, stride = ystep[a[1]]
                    patches.append((r, w, base, stride))
                elif a.slot in moving:
                    base, stride = moving[a.slot]
                    patches.append((r, w, base + a.offset, stride))
                else:
                    addr = fixed.get(a.slot)
                    if addr is None:
                        addr = env[n + a.slot]
                        if addr is None:
                            raise DlvmError(f"@{plan.name}: slot {a.slot} has no memory")
                    records[r, w] = addr + a.offset
            patch = np.array(patches or [(0, 0, 0, 0)], np.int64).reshape(-1, 4)
            run = (records.ctypes.data, len(records), patch.ctypes.data, len(patches))
            if self.threaded_blas:
                self.driver(*run, length, int(self.reverse))
            else:
                with one_blas_thread():
                    self.driver(*run, length, int(self.reverse))
        finally:
            self.prog.give_arena(env)
        del keep
        return cs + ys


class _NotNative(Exception):
    pass


def _check(a: np.ndarray, want: tuple, plan, slot: int) -> None:
    if a.shape != want:
        name = plan.slots[slot].name
        raise DlvmError(f"@{plan.name}: %{name} has shape {a.shape} in the loop, expected {want}")


def native_scan(prog, carries: int, xs: int, reverse: bool) -> NativeScan | str:
    """The scan of body `prog` (a CpuProgram) on the native driver, or why not (a str)."""
    if any(prog.plan.slots[s].role != PARAM for s in prog.plan.params):
        return "a parameter without its own slot"
    lp = loop_plan(prog.plan, carries, xs)
    if isinstance(lp, str):
        return lp
    try:
        return NativeScan(prog, lp, reverse)
    except _NotNative as e:
        return str(e)


__all__ = ["NativeScan", "native_scan"]
