"""Loops run by the native loop driver (runtime/loop_driver.py): a body's compiled program (a
CpuProgram) supplies its kernels and an arena; the steps run in native calls, with no Python
between steps (the driver returns to Python about every 10 ms, so Ctrl-C stops a long loop).

    scan = native_scan(body_program, carries=1, xs=1, reverse=False)  # or a str: why not
    carries_and_ys = scan(carries, xs, withs, length)
    loop = native_while(cond_program, body_program, carries=2)        # or a str: why not
    carries = loop(carries_and_withs)

The body's buffers are reused across steps: its temporaries stay in the one arena, its
outputs are one buffer each per call, its ys are written into their rows of the stacked ys (in
place where the body's output is the y's alone; the stacked ys of a call are reused by the
next once nothing else holds them, `Recycled`). Products whose B is a loop-invariant weight
run through our GEMM on that weight packed once per call (packed_products.py). A carry whose result is an output buffer of
its own swaps buffers with it every step (ping-pong); other carry results are copied into the
carry parameter after each step. A kernel that a plain call splits over threads runs as one
call on the driver's thread (the same bits: its chunks are independent). What cannot run
natively (a reduction cut in slices, a gather, a product BLAS cannot read in place:
planning/loop_plan.py says which) gives a str here and the loop runs through the Python driver
(pipeline/loops.py).

Shared state (threads): a NativeScan / NativeWhile is read only after construction; each call
builds its own records array and takes its own arenas from the programs (as a plain call
does); OpenBLAS runs on one thread while any loop of small products is in flight (a count,
under a lock).
"""

from __future__ import annotations

import sys
import threading

import numpy as np

from ...errors import DlvmError
from ..kernels.kernel_spec import KernelSpec
from ..kernels.spec import DTYPES
from ..planning.loop_plan import BREAK, CALL, COPY, DGEMM, MAX_ARGS, SGEMM, LoopPlan, Ptr, loop_plan
from ..planning.plan import OUTPUT, PARAM, GemmStep
from ..runtime.attention_cpu import one_blas_thread  # one count shared with attention
from ..runtime.buffers import aligned_empty, data_ptr
from ..runtime.cpu_kernel import compile_cpu
from ..runtime.loop_driver import BUDGET_CYCLES, WORDS, gemm_address, loop_driver
from ..runtime.row_kernel import RowKernel
from .packed_products import SCRATCH, pack_buffers, pack_withs, prepack, scratch_buffer

# A loop whose products are all below this many multiply-adds runs them on one OpenBLAS thread
# (runtime/attention_cpu.one_blas_thread); one at or above it keeps OpenBLAS's threads.
THREADED_BLAS_MACS = 1 << 24
# Carries whose result has a buffer of its own swap buffers with it every step instead of being
# copied (benchmarks/rnn.py measures both; off, every carry result is copied).
SWAP_CARRIES = True
NOOP = -1  # a record the driver skips (a kernel over no elements)
FOREVER = (1 << 62) - 1  # a while loop's length


class NotNative(Exception):
    """Why a body cannot run on the native driver (its loop runs on the Python driver)."""


def _head(k) -> tuple | None:
    """The leading integers of one call running kernel `k` whole on the calling thread, with
    the bits of a plain call (CpuKernel.one_thread_head; a row kernel's rows are independent).
    None: a kernel over nothing. A reduction that a plain call cuts in slices: not native."""
    if isinstance(k, RowKernel):
        if k.spec.rows == 0:
            return None
        if k.spec.cols == 0:
            raise NotNative("a row kernel over empty rows")
        return (0, k.spec.rows)
    head = k.one_thread_head()
    if head is None and not (isinstance(k.spec, KernelSpec) and k.size == 0):
        raise NotNative("a reduction split over threads")
    return head


class Segment:
    """One compiled program's records (a LoopPlan), their pointers resolved at each call."""

    def __init__(self, prog, lp: LoopPlan):
        self.prog, self.plan, self.lp = prog, prog.plan, lp
        plan = self.plan
        self.template = np.zeros((len(lp.records), WORDS), np.int64)
        self.pointers: list = []  # (record, word, Ptr or ("y", j))
        self.kernels = []  # kept alive: the records hold their addresses and dims arrays
        for r, rec in enumerate(lp.records):
            row = self.template[r]
            row[0] = rec.kind
            args = list(rec.args)
            if rec.kind == CALL and rec.fn[0] == "packed_gemm":  # our GEMM (packed_products.py)
                row[1] = rec.fn[1]
            elif rec.kind == CALL:
                what, i = rec.fn
                step = plan.steps[i]
                if what == "epilogue":
                    assert isinstance(step, GemmStep)
                    k = compile_cpu(step.epilogue.spec)
                else:
                    k = prog.kernels[id(step)]
                head = _head(k)
                if head is None:
                    row[0] = NOOP
                    continue
                self.kernels.append(k)
                args = list(head) + args + [k.dims_ptr]
                row[1] = k.address
            elif rec.kind != COPY:
                addr = gemm_address(rec.fn[1])
                if addr is None:
                    raise NotNative("no CBLAS in this process")
                row[1] = addr
            if len(args) > MAX_ARGS:
                raise NotNative("a call with too many arguments")
            for w, a in enumerate(args):
                if isinstance(a, (Ptr, tuple)):
                    self.pointers.append((r, 2 + w, a))
                else:
                    row[2 + w] = a
        macs = [r.args[3] * r.args[4] * r.args[5] for r in lp.records if r.kind in (SGEMM, DGEMM)]
        self.max_macs = max(macs, default=0)
        # outputs with a buffer per call (not written into ys, not a swapped carry's result)
        mine = set(lp.direct_ys) | set(lp.swapped.values())
        self.outputs = [s for s in plan.slots if s.role == OUTPUT and s.index not in mine]

    def split(self, per_call) -> tuple[list, list]:
        """(pointers whose slot is not in `per_call`, pointers whose slot is): the first are
        placed once per prepared table, the second at each call."""
        once, each = [], []
        for p in self.pointers:
            key = p[2] if isinstance(p[2], tuple) else p[2].slot
            (each if key in per_call else once).append(p)
        return once, each

    def place(self, records, first: int, where, env, patches: list, pointers=None) -> None:
        """Fill this segment's pointers (or those given) into records[first:] (or add patches
        for those that move with the step). `where(slot)` is ("fixed", addr), ("moving", base,
        stride, mode) or None (the slot lives in the arena `env`); a ("y", j) pointer asks
        where(("y", j))."""
        n = len(self.plan.slots)
        row_bytes = WORDS * 8
        base_addr = records.ctypes.data
        for r, w, a in self.pointers if pointers is None else pointers:
            key, offset = (a, 0) if isinstance(a, tuple) else (a.slot, a.offset)
            got = where(key)
            if got is None:
                addr = env[n + key]
                if addr is None:
                    raise DlvmError(f"@{self.plan.name}: slot {key} has no memory")
                records[first + r, w] = addr + offset
            elif got[0] == "fixed":
                records[first + r, w] = got[1] + offset
            else:
                _, base, stride, mode = got
                at = base_addr + (first + r) * row_bytes + w * 8
                patches.append((at, base + offset, stride, mode))


class TablePool:
    """A loop's records tables, each made once with what stays put between calls (the arena,
    the body's own output buffers) and reused; one per call in flight (threads take their
    own), so that a call writes only the words of its own arrays (carries, xs, withs, ys)."""

    def __init__(self, make):
        self.make = make  # () -> a new table (whatever the loop keeps with it)
        self.free: list = []
        self.lock = threading.Lock()

    def take(self):
        with self.lock:
            if self.free:
                return self.free.pop()
        return self.make()

    def give(self, table) -> None:
        with self.lock:
            self.free.append(table)


def _buffers(seg: Segment, places: dict) -> list:
    """Buffers of the segment's own outputs (kept with a prepared table), entered in places."""
    keep = []
    for s in seg.outputs:
        buf = aligned_empty(s.shape, DTYPES[s.dtype])
        keep.append(buf)
        places[s.index] = ("fixed", data_ptr(buf))
    return keep


def _dtype(plan, s):
    return DTYPES[plan.slots[s].dtype]


def _shape(plan, s):
    return tuple(plan.slots[s].shape)


def _array(value, plan, slot: int, lead: tuple = (), copy: bool = False) -> np.ndarray:
    """`value` as a C-contiguous array of the slot's dtype and shape (after `lead` axes: a
    scan's steps), a copy if asked; a scalar may come as one element of any shape. A wrong
    shape is an error."""
    want = (*lead, *_shape(plan, slot))
    dt = _dtype(plan, slot)
    a = np.array(value, dt, order="C", copy=True) if copy else np.asarray(value, dt, order="C")
    if a.shape != want:
        if a.size != 1 or want != ():
            name = plan.slots[slot].name
            raise DlvmError(
                f"@{plan.name}: %{name} has shape {a.shape} in the loop, expected {want}"
            )
        a = a.reshape(())
    return a


def drive(driver, records, patches: list, length: int, reverse: bool) -> tuple[int, bool]:
    """Run the loop to its end (or its BREAK), returning to Python every BUDGET_CYCLES so that
    a signal's handler (KeyboardInterrupt) runs between two steps. (steps run, whether broke)."""
    patch = np.array(patches or [(0, 0, 0, 0)], np.int64).reshape(-1, 4)
    state = np.array([0, length, int(reverse), BUDGET_CYCLES, 0, 0], np.int64)
    args = (records.ctypes.data, len(records), patch.ctypes.data, len(patches), state.ctypes.data)
    while True:
        driver(*args)
        if state[4] or state[0] >= length:
            return int(state[0]), bool(state[4])


class _Carries:
    """The carry buffers of one call: A (a copy of the initial value) and, for a swapped
    carry, B (its result's buffer); after `steps` steps a swapped carry's value is in A when
    `steps` is even, else in B."""

    def __init__(self, plan, slots, values, swapped: dict):
        self.a = []
        for s, c in zip(slots, values):
            self.a.append(_array(c, plan, s, copy=True))
        self.b = {c: aligned_empty(self.a[c].shape, self.a[c].dtype) for c in swapped}

    def param(self, c: int):
        a = self.a[c]
        if c not in self.b:
            return ("fixed", data_ptr(a) if a.size else 0)
        pa, pb = data_ptr(a), data_ptr(self.b[c])
        return ("moving", pa, pb - pa, 1)

    def result(self, c: int):
        pa, pb = data_ptr(self.a[c]), data_ptr(self.b[c])
        return ("moving", pb, pa - pb, 1)

    def values(self, steps: int) -> list:
        return [self.b[c] if c in self.b and steps % 2 else a for c, a in enumerate(self.a)]


# Stacked ys of at least this many bytes are reused across calls (`Recycled`)
RECYCLE_BYTES = 1 << 16


class Recycled:
    """A scan's stacked ys of its last call, reused by the next call once nothing else holds
    them (no reference but this list's, and no view of their memory): the LSTM's value and
    gradient at hidden 256, T = 64 writes 12 MiB of ys a call, and glibc hands freed blocks
    that large back to the OS, so each call faulted fresh pages in (benchmarks/rnn.py, fresh
    processes: 29.9 and 30.9 ms of CPU a call, 27.2 and 27.6 with glibc told to keep freed
    memory). Costs one call's ys kept alive between calls."""

    def __init__(self):
        self.arrays: list = []
        self.lock = threading.Lock()

    def take(self, shape: tuple, dtype) -> np.ndarray:
        with self.lock:
            for i in range(len(self.arrays)):
                a = self.arrays[i]
                fits = a.shape == shape and a.dtype == dtype
                del a
                if fits and _only_listed(self.arrays, i):
                    return self.arrays.pop(i)
        return aligned_empty(shape, dtype)

    def keep(self, arrays: list) -> None:
        big = [a for a in arrays if a.nbytes >= RECYCLE_BYTES]
        with self.lock:
            self.arrays = big


def _only_listed(arrays: list, i: int) -> bool:
    """Nothing but the list holds arrays[i], nor its memory (an aligned_empty buffer, the base
    of every view of it): their reference counts equal a probe's that only a list holds, read
    the same way (so the interpreter's own counting cancels out)."""
    probe = [aligned_empty((1,), np.uint8)]
    return sys.getrefcount(arrays[i]) == sys.getrefcount(probe[0]) and sys.getrefcount(
        arrays[i].base
    ) == sys.getrefcount(probe[0].base)


class NativeScan:
    def __init__(self, prog, lp: LoopPlan, reverse: bool):
        # products with a loop-invariant weight: the weight packed once per call
        lp, self.packs = prepack(lp, prog.plan, prog.plan.params[lp.carries + lp.xs :])
        self.prog, self.plan, self.lp, self.reverse = prog, prog.plan, lp, reverse
        self.seg = Segment(prog, lp)
        self.driver = loop_driver()
        self.threaded_blas = self.seg.max_macs >= THREADED_BLAS_MACS
        plan, nc, nx = self.plan, lp.carries, lp.xs
        self.carry_slots = plan.params[:nc]
        self.x_slots = plan.params[nc : nc + nx]
        self.with_slots = plan.params[nc + nx :]
        self.y_slots = [r.slot for r in plan.results[nc:]]
        per_call = set(plan.params) | set(lp.swapped.values()) | set(lp.direct_ys)
        per_call |= {("y", j) for j in range(len(self.y_slots))}
        per_call |= {("packed", j) for j in range(len(self.packs))}
        self.once, self.each = self.seg.split(per_call)
        self.tables = TablePool(self._prepare)
        self.recycled = Recycled()

    def _prepare(self):
        """(records with the arena's and the outputs' pointers in place, arena, buffers)."""
        env = self.prog.take_arena()
        places: dict = {}
        keep = _buffers(self.seg, places)
        packed = pack_buffers(self.packs)
        if self.packs:
            keep.append(scratch_buffer())
            places[SCRATCH] = ("fixed", data_ptr(keep[-1]))
        records = self.seg.template.copy()
        self.seg.place(records, 0, places.get, env, [], self.once)
        return records, env, keep, packed

    def __call__(self, carries, xs, withs, length: int) -> list:
        plan, lp = self.plan, self.lp
        places: dict = {}
        keep = []
        cs = _Carries(plan, self.carry_slots, carries, lp.swapped)
        for c, s in enumerate(self.carry_slots):
            places[s] = cs.param(c)
        for c, s in lp.swapped.items():
            places[s] = cs.result(c)
        for s, x in zip(self.x_slots, xs):
            x = _array(x, plan, s, (length,))
            keep.append(x)
            places[s] = ("moving", data_ptr(x) if x.size else 0, x.strides[0] if x.ndim else 0, 0)
        for s, w in zip(self.with_slots, withs):
            w = _array(w, plan, s)
            keep.append(w)
            places[s] = ("fixed", data_ptr(w) if w.size else 0)
        ys = [self.recycled.take((length, *_shape(plan, s)), _dtype(plan, s)) for s in self.y_slots]
        for j, y in enumerate(ys):
            places[("y", j)] = ("moving", data_ptr(y) if y.size else 0, y.strides[0], 0)
        for slot, j in lp.direct_ys.items():
            places[slot] = places[("y", j)]
        table = self.tables.take()
        try:
            records, env, _, packed = table
            if self.packs:
                pack_withs(self.packs, dict(zip(self.with_slots, keep[len(xs) :])), packed)
                for j, buf in enumerate(packed):
                    places[("packed", j)] = ("fixed", data_ptr(buf))
            patches: list = []
            self.seg.place(records, 0, places.get, env, patches, self.each)
            if self.threaded_blas:
                drive(self.driver, records, patches, length, self.reverse)
            else:
                with one_blas_thread():
                    drive(self.driver, records, patches, length, self.reverse)
        finally:
            self.tables.give(table)
        del keep
        self.recycled.keep(ys)
        return cs.values(length) + ys


class NativeWhile:
    """`while cond(carries, withs): carries = body(carries, withs)` as one native loop: each
    step runs the test's records, a BREAK on its bool, then the body's records."""

    def __init__(self, cond_prog, cond_lp: LoopPlan, body_prog, body_lp: LoopPlan):
        self.cond, self.body = Segment(cond_prog, cond_lp), Segment(body_prog, body_lp)
        self.nc = body_lp.carries
        self.driver = loop_driver()
        self.threaded_blas = max(self.cond.max_macs, self.body.max_macs) >= THREADED_BLAS_MACS
        cplan, bplan = cond_prog.plan, body_prog.plan
        self.cond_once, self.cond_each = self.cond.split(set(cplan.params))
        body_each = set(bplan.params) | set(body_lp.swapped.values())
        self.body_once, self.body_each = self.body.split(body_each)
        self.tables = TablePool(self._prepare)

    def _prepare(self):
        """(records, the two arenas, buffers, the test's bool), the arenas' and the outputs'
        pointers in place."""
        cplaces: dict = {}
        bplaces: dict = {}
        pred = np.zeros(1, np.bool_)
        cplaces[("y", 0)] = ("fixed", data_ptr(pred))
        for slot in self.cond.lp.direct_ys:
            cplaces[slot] = cplaces[("y", 0)]
        keep = _buffers(self.cond, cplaces) + _buffers(self.body, bplaces) + [pred]
        n_cond = len(self.cond.template)
        records = np.concatenate(
            [self.cond.template, np.zeros((1, WORDS), np.int64), self.body.template]
        )
        records[n_cond, 0] = BREAK
        records[n_cond, 2] = data_ptr(pred)
        cenv, benv = self.cond.prog.take_arena(), self.body.prog.take_arena()
        self.cond.place(records, 0, cplaces.get, cenv, [], self.cond_once)
        self.body.place(records, n_cond + 1, bplaces.get, benv, [], self.body_once)
        return records, cenv, benv, keep

    def __call__(self, vals) -> list:
        nc = self.nc
        cplan, bplan = self.cond.plan, self.body.plan
        lp = self.body.lp
        keep = []
        cs = _Carries(bplan, bplan.params[:nc], vals[:nc], lp.swapped)
        cplaces: dict = {}
        bplaces: dict = {}
        for c in range(nc):
            cplaces[cplan.params[c]] = bplaces[bplan.params[c]] = cs.param(c)
        for c, s in lp.swapped.items():
            bplaces[s] = cs.result(c)
        for k, w in enumerate(vals[nc:]):
            for plan, places in ((cplan, cplaces), (bplan, bplaces)):
                s = plan.params[nc + k]
                a = _array(w, plan, s)
                keep.append(a)
                places[s] = ("fixed", data_ptr(a) if a.size else 0)
        table = self.tables.take()
        try:
            records, cenv, benv, _ = table
            patches: list = []
            self.cond.place(records, 0, cplaces.get, cenv, patches, self.cond_each)
            n_cond = len(self.cond.template)
            self.body.place(records, n_cond + 1, bplaces.get, benv, patches, self.body_each)
            if self.threaded_blas:
                steps, _ = drive(self.driver, records, patches, FOREVER, False)
            else:
                with one_blas_thread():
                    steps, _ = drive(self.driver, records, patches, FOREVER, False)
        finally:
            self.tables.give(table)
        del keep
        return cs.values(steps)


def _program(compiled):
    """The CpuProgram of a compiled straight function, None for one with loops of its own."""
    prog = getattr(compiled, "program", None)
    return prog if prog is not None and hasattr(prog, "take_arena") else None


def _params_own_slots(prog) -> bool:
    return all(prog.plan.slots[s].role == PARAM for s in prog.plan.params)


def native_scan(prog, carries: int, xs: int, reverse: bool) -> NativeScan | str:
    """The scan of body `prog` (a CpuProgram) on the native driver, or why not (a str)."""
    if not _params_own_slots(prog):
        return "a parameter without its own slot"
    lp = loop_plan(prog.plan, carries, xs, swap=SWAP_CARRIES)
    if isinstance(lp, str):
        return lp
    try:
        return NativeScan(prog, lp, reverse)
    except NotNative as e:
        return str(e)


def native_while(cond, body, carries: int) -> NativeWhile | str:
    """The while loop of compiled functions `cond` and `body` (what pipeline/loops.py compiles:
    each has a CpuProgram `.program` when it has no loops of its own) on the native driver, or
    why not (a str)."""
    cprog, bprog = _program(cond), _program(body)
    if cprog is None or bprog is None:
        return "a test or body with loops of its own"
    if not (_params_own_slots(cprog) and _params_own_slots(bprog)):
        return "a parameter without its own slot"
    clp = loop_plan(cprog.plan, 0, 0)
    if isinstance(clp, str):
        return clp
    if len(cprog.plan.results) != 1 or cprog.plan.slots[cprog.plan.results[0].slot].dtype != "bool":
        return "a test that is not one bool"
    blp = loop_plan(bprog.plan, carries, 0, swap=SWAP_CARRIES)
    if isinstance(blp, str):
        return blp
    if len(bprog.plan.results) != carries:
        return "a body with other results than its carries"
    try:
        return NativeWhile(cprog, clp, bprog, blp)
    except NotNative as e:
        return str(e)


__all__ = [
    "FOREVER",
    "NativeScan",
    "NativeWhile",
    "NotNative",
    "Segment",
    "drive",
    "native_scan",
    "native_while",
]
