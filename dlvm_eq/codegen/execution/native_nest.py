"""Scans whose body has loops or branches of its own (a scan in a scan, a cond or a while loop
in a scan) on the native loop driver: every level is a records table of its own, and an inner
loop is a LOOP record of its parent that runs the driver again on the inner table (its state
reset by a COPY first), so the whole nest runs without Python between steps. An inner loop
pauses like the outer one (about every 10 ms), and its parents pause at the record that runs
it, so Ctrl-C stops a long inner loop too.

    scan = native_nested_scan(body, carries=1, xs=1, reverse=False, fn=body_function)
    carries_and_ys = scan(carries, xs, withs, length)        # (a str above: why not natively)
    loop = native_nested_while(cond, body, carries=1, fn=body_function)
    carries = loop(carries_and_withs)

`body` is what pipeline/loops.py compiles for a function with control flow: its `parts()` are
(params, steps, results), a step ("piece", compiled, inputs, outputs) or ("region", inst,
[compiled functions], outputs). Every value between steps has a buffer of its own per call;
a piece's results are copied into theirs (or written there, as a scan's ys); an inner scan's
carries are copied in before it runs, and its carry results and ys are read where it left
them. A cond runs each branch as a one-step loop that BREAKs at once unless its branch is the
taken one; a switch the same, each branch's loop beginning with a PICK of its index.

Addresses that move with a step (xs slices, ys rows) are patches of the level whose step moves
them; a word in an inner table that moves with an outer step is patched by the outer level
(patches hold absolute addresses, runtime/loop_driver.py), so an inner scan over a slice of the
outer xs reads the right slice at every outer step.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import DlvmError
from ...ir.control_flow import elements
from ...ir.module import Const
from ..kernels.spec import DTYPES
from ..planning.loop_plan import BREAK, COPY, loop_plan
from ..runtime.attention_cpu import one_blas_thread
from ..runtime.buffers import aligned_empty, data_ptr
from ..runtime.loop_driver import LOOP, PICK, STATE_WORDS, WORDS, loop_driver
from .native_loop import FOREVER, NotNative, Segment, TablePool, drive


class Fixed:
    def __init__(self, addr: int):
        self.addr = addr

    def plus(self, offset: int):
        return Fixed(self.addr + offset)


class Input:
    """The k-th buffer a call passes in (a carry, an xs, a with, a ys), plus `offset` bytes:
    its word is written at each call, the rest of the tables are made once."""

    def __init__(self, k: int, offset: int = 0):
        self.k, self.offset = k, offset

    def plus(self, offset: int):
        return Input(self.k, self.offset + offset)


class Moving:
    """base + i * stride at every step of `level` (i: the step, or the step's parity in mode
    1); `base` is itself a place (it may move with an outer level)."""

    def __init__(self, level, base, stride: int, mode: int = 0):
        self.level, self.base, self.stride, self.mode = level, base, stride, mode

    def plus(self, offset: int):
        return Moving(self.level, self.base.plus(offset), self.stride, self.mode)


class _Level:
    """One loop's records and patches, as rows of Python lists until `freeze`."""

    def __init__(self, length: int, reverse: bool):
        self.rows: list = []
        self.patches: list = []
        self.state = np.array([0, length, int(reverse), 0, 0, 0], np.int64)
        self.start = self.state.copy()  # what a COPY record resets state to

    def row(self) -> list:
        r = [0] * WORDS
        self.rows.append(r)
        return r


class _Build:
    """One call's tables, buffers and deferred writes (a word's value may be an address that
    exists only once every table is an array)."""

    def __init__(self):
        self.writes: list = []  # (table key, row, col, value: int | place | ("addr", ...))
        self.keep: list = []
        self.arenas: list = []  # (program, env)
        self.levels: list = []
        self.fills: list = []  # (table, row, col, Input): the words each call writes

    def level(self, length: int, reverse: bool) -> _Level:
        lv = _Level(length, reverse)
        self.levels.append(lv)
        return lv

    def buffer(self, shape, dtype) -> np.ndarray:
        b = aligned_empty(tuple(shape), dtype)
        self.keep.append(b)
        return b

    def put(self, lv: _Level, row: int, col: int, place) -> None:
        """records[row][col] of level `lv` holds `place` (an int or a place) at each step."""
        self.writes.append((("r", lv), row, col, place))

    def freeze(self) -> None:
        """Expand moving places into patch rows, make every table an array, write the words."""
        todo = list(self.writes)
        final: list = []
        while todo:
            (kind, lv), row, col, place = todo.pop()
            if isinstance(place, Moving):
                m = place.level
                m.patches.append([0, 0, place.stride, place.mode])
                p = len(m.patches) - 1
                final.append((("p", m), p, 0, ("at", (kind, lv), row, col)))
                todo.append((("p", m), p, 1, place.base))
            else:
                final.append(((kind, lv), row, col, place))
        tables: dict = {}
        for lv in self.levels:
            rows = lv.rows or [[0] * WORDS]
            tables[("r", id(lv))] = np.array(rows, np.int64).reshape(-1, WORDS)
            tables[("p", id(lv))] = np.array(lv.patches or [[0, 0, 0, 0]], np.int64).reshape(-1, 4)
            tables[("s", id(lv))] = lv.state
            tables[("t", id(lv))] = lv.start
        self.tables = tables
        for (kind, lv), row, col, place in final:
            table = tables[(kind, id(lv))]
            if isinstance(place, tuple) and place[0] == "at":
                _, (k2, lv2), r2, c2 = place
                t2 = tables[(k2, id(lv2))]
                table[row, col] = t2.ctypes.data + (r2 * t2.shape[1] + c2) * 8
            elif isinstance(place, tuple) and place[0] == "addr":
                table[row, col] = tables[(place[1], id(place[2]))].ctypes.data
            elif isinstance(place, tuple) and place[0] == "count":  # a level's records
                table[row, col] = len(place[1].rows)
            elif isinstance(place, tuple) and place[0] == "patches":  # a level's patches
                table[row, col] = len(place[1].patches)
            elif isinstance(place, Fixed):
                table[row, col] = place.addr
            elif isinstance(place, Input):
                self.fills.append((table, row, col, place))
            else:
                table[row, col] = int(place)

    def table(self, lv: _Level):
        return self.tables[("r", id(lv))], len(lv.rows), self.tables[("p", id(lv))], len(lv.patches)

    def fill(self, arrays: list) -> None:
        """Write the addresses of this call's buffers (Input k is arrays[k])."""
        addrs = [data_ptr(a) if a.size else 0 for a in arrays]
        for table, row, col, place in self.fills:
            table[row, col] = addrs[place.k] + place.offset


def _nbytes(t) -> int:
    return math.prod(t.shape) * t.dtype.numpy.itemsize


class _Emit:
    """Records of one run of a body with control flow (its `parts()`), into level `lv`."""

    def __init__(self, build: _Build, segments: dict):
        self.b = build
        self.segments = segments  # id(program) -> (program, its Segment), kept across calls

    def const(self, c) -> Fixed:
        a = np.asarray(c.value, c.type.dtype.numpy).reshape(c.type.shape)
        a = np.ascontiguousarray(a)
        self.b.keep.append(a)
        return Fixed(data_ptr(a) if a.size else 0)

    def place_of(self, places: dict, o):
        if isinstance(o, Const):
            return self.const(o)
        return places[id(o)]

    def copy(self, lv: _Level, dst, src, nbytes: int) -> None:
        """A COPY record: nbytes from place src to place dst at every step of lv."""
        if nbytes == 0:
            return
        r = lv.row()
        i = len(lv.rows) - 1
        r[0] = COPY
        r[4], r[5], r[6], r[7], r[8] = 1, nbytes, 0, 1, 1
        self.b.put(lv, i, 2, dst)
        self.b.put(lv, i, 3, src)

    def program(self, lv: _Level, body, in_places: list, out_places: list) -> None:
        """Records running compiled `body` (a straight program or one with control flow) on
        the inputs at `in_places`, its results written or copied to `out_places` (buffers of
        their own, never an input's)."""
        prog = getattr(body, "program", None)
        if prog is not None and hasattr(prog, "take_arena"):
            self.straight(lv, prog, in_places, out_places)
            return
        if not hasattr(body, "parts"):
            raise NotNative("a body the native driver cannot run")
        params, steps, results = body.parts()
        places = {id(p): pl for p, pl in zip(params, in_places)}
        for step in steps:
            if step[0] == "piece":
                _, compiled, inputs, outputs = step
                ins = [self.place_of(places, v) for v in inputs]
                outs = [
                    Fixed(data_ptr(self.b.buffer(v.type.shape, v.type.dtype.numpy)))
                    for v in outputs
                ]
                self.program(lv, compiled, ins, outs)
                places.update((id(v), p) for v, p in zip(outputs, outs))
            else:
                _, inst, compiled, outputs = step
                ins = [self.place_of(places, v) for v in inst.operands]
                outs = self.region(lv, inst, compiled, ins, outputs)
                places.update((id(v), p) for v, p in zip(outputs, outs))
        for dst, r in zip(out_places, results):
            self.copy(lv, dst, self.place_of(places, r), _nbytes(r.type))

    def straight(self, lv: _Level, prog, in_places: list, out_places: list) -> None:
        plan = prog.plan
        hit = self.segments.get(id(prog))
        if hit is None:
            lp = loop_plan(plan, 0, 0, swap=False)
            if isinstance(lp, str):
                raise NotNative(lp)
            hit = self.segments[id(prog)] = (prog, Segment(prog, lp))
        seg = hit[1]
        lp = seg.lp
        env = prog.take_arena()
        self.b.arenas.append((prog, env))
        slots: dict = {s: p for s, p in zip(plan.params, in_places)}
        for j, p in enumerate(out_places):
            slots[("y", j)] = p
        for slot, j in lp.direct_ys.items():
            slots[slot] = out_places[j]
        for s in seg.outputs:
            slots[s.index] = Fixed(data_ptr(self.b.buffer(s.shape, DTYPES[s.dtype])))
        first = len(lv.rows)
        n = len(plan.slots)
        for row in seg.template:
            lv.rows.append([int(v) for v in row])
        for r, w, a in seg.pointers:
            key, offset = (a, 0) if isinstance(a, tuple) else (a.slot, a.offset)
            place = slots.get(key)
            if place is None:
                addr = env[n + key]
                if addr is None:
                    raise DlvmError(f"@{plan.name}: slot {key} has no memory")
                place = Fixed(addr)
            self.b.put(lv, first + r, w, place.plus(offset))

    def carried(self, lv: _Level, body, carry: list, rest: list, y_outs: list, types) -> None:
        """Records of one step of `body` whose first results are the carries at `carry`: they
        are computed into buffers of their own, then copied onto the carries (a kernel may
        read a carry after another wrote its result)."""
        temps = [Fixed(data_ptr(self.b.buffer(t.shape, t.dtype.numpy))) for t in types]
        self.program(lv, body, carry + rest, temps + y_outs)
        for dst, src, t in zip(carry, temps, types):
            self.copy(lv, dst, src, _nbytes(t))

    def loop(self, lv: _Level, inner: _Level) -> None:
        """Records of lv that reset inner's state and run it to its end (a LOOP record: when
        the inner loop pauses, lv pauses at that record, and goes on there on the next call)."""
        self.copy_state(lv, inner)
        r = lv.row()
        i = len(lv.rows) - 1
        r[0] = LOOP
        self.b.put(lv, i, 2, ("addr", "r", inner))
        self.b.put(lv, i, 4, ("addr", "p", inner))
        self.b.put(lv, i, 5, ("patches", inner))
        self.b.put(lv, i, 6, ("addr", "s", inner))
        self.b.put(lv, i, 3, ("count", inner))

    def copy_state(self, lv: _Level, inner: _Level) -> None:
        r = lv.row()
        i = len(lv.rows) - 1
        r[0] = COPY
        r[4], r[5], r[6], r[7], r[8] = 1, STATE_WORDS * 8, 0, 1, 1
        self.b.put(lv, i, 2, ("addr", "s", inner))
        self.b.put(lv, i, 3, ("addr", "t", inner))

    def region(self, lv: _Level, inst, compiled: list, ins: list, outputs) -> list:
        attrs = inst.attrs
        if inst.op == "scan":
            nc, nx, n = attrs["carries"], attrs["xs"], attrs["length"]
            inner = self.b.level(n, attrs["reverse"])
            carry = []
            for v, src in zip(outputs[:nc], ins[:nc]):
                buf = Fixed(data_ptr(self.b.buffer(v.type.shape, v.type.dtype.numpy)))
                self.copy(lv, buf, src, _nbytes(v.type))
                carry.append(buf)
            xs_in = []
            for x, src in zip(inst.operands[nc : nc + nx], ins[nc : nc + nx]):
                step_bytes = _nbytes(x.type) // max(n, 1)
                xs_in.append(Moving(inner, src, step_bytes))
            ys = []
            for v in outputs[nc:]:
                buf = self.b.buffer(v.type.shape, v.type.dtype.numpy)
                ys.append(Fixed(data_ptr(buf) if buf.size else 0))
            y_rows = [
                Moving(inner, y, _nbytes(v.type) // max(n, 1)) for y, v in zip(ys, outputs[nc:])
            ]
            types = [v.type for v in outputs[:nc]]
            self.carried(inner, compiled[0], carry, xs_in + ins[nc + nx :], y_rows, types)
            self.loop(lv, inner)
            return carry + ys
        if inst.op == "while":
            nc = attrs["carries"]
            inner = self.b.level(FOREVER, False)
            carry = []
            for v, src in zip(outputs, ins[:nc]):
                buf = Fixed(data_ptr(self.b.buffer(v.type.shape, v.type.dtype.numpy)))
                self.copy(lv, buf, src, _nbytes(v.type))
                carry.append(buf)
            pred = Fixed(data_ptr(self.b.buffer((), np.bool_)))
            self.program(inner, compiled[0], carry + ins[nc:], [pred])
            self.brk(inner, pred, 0)
            self.carried(inner, compiled[1], carry, ins[nc:], [], [v.type for v in outputs])
            self.loop(lv, inner)
            return carry
        if inst.op == "cond":
            outs = [
                Fixed(data_ptr(self.b.buffer(v.type.shape, v.type.dtype.numpy))) for v in outputs
            ]
            for branch, skip_if in ((compiled[0], 0), (compiled[1], 1)):
                inner = self.b.level(1, False)
                self.brk(inner, ins[0], skip_if)
                self.program(inner, branch, ins[1:], outs)
                self.loop(lv, inner)
            return outs
        if inst.op == "switch":  # branch k clamped to the branches, as the interpreter does
            outs = [
                Fixed(data_ptr(self.b.buffer(v.type.shape, v.type.dtype.numpy))) for v in outputs
            ]
            last = len(compiled) - 1
            for k, branch in enumerate(compiled):
                inner = self.b.level(1, False)
                r = inner.row()
                r[0], r[3], r[4] = PICK, k, last
                self.b.put(inner, len(inner.rows) - 1, 2, ins[0])
                self.program(inner, branch, ins[1:], outs)
                self.loop(lv, inner)
            return outs
        raise NotNative(f"a {inst.op} inside a loop body")

    def brk(self, lv: _Level, pred, when: int) -> None:
        r = lv.row()
        i = len(lv.rows) - 1
        r[0] = BREAK
        r[3] = when
        self.b.put(lv, i, 2, pred)


class NestedScan:
    def __init__(self, body, carries: int, xs: int, reverse: bool, types: list):
        self.body, self.nc, self.nx, self.reverse = body, carries, xs, reverse
        self.types = types  # the body's parameter types (carries, xs, withs) and result types
        self.driver = loop_driver()
        self.segments: dict = {}  # the straight programs' records, made on the first call
        self.tables = TablePool(self._build)

    def _build(self):
        """The tables of one step (any length: the top level's state is each call's own)."""
        b = _Build()
        top = b.level(0, self.reverse)
        e = _Emit(b, self.segments)
        params, results = self.types
        nc, nx = self.nc, self.nx
        n_in = len(params)
        ins: list = [Input(k) for k in range(nc)]  # carries, then xs (a slice a step), withs
        ins += [Moving(top, Input(k), _nbytes(params[k])) for k in range(nc, nc + nx)]
        ins += [Input(k) for k in range(nc + nx, n_in)]
        y_rows = [Moving(top, Input(n_in + j), _nbytes(t)) for j, t in enumerate(results[nc:])]
        try:
            e.carried(top, self.body, ins[:nc], ins[nc:], y_rows, results[:nc])
            b.freeze()
        except BaseException:
            _give_arenas(b)
            raise
        return b, top

    def __call__(self, carries, xs, withs, length: int) -> list:
        params, results = self.types
        nc, nx = self.nc, self.nx
        cs = []
        for t, c in zip(params[:nc], carries):
            a = np.array(c, t.dtype.numpy, order="C", copy=True).reshape(t.shape)
            cs.append(a)
        arrays = list(cs)
        for t, x in zip(params[nc : nc + nx], xs):
            x = np.ascontiguousarray(x, t.dtype.numpy)
            if x.shape != (length, *t.shape):
                raise DlvmError(f"a scan's xs has shape {x.shape}, expected {(length, *t.shape)}")
            arrays.append(x)
        for t, w in zip(params[nc + nx :], withs):
            arrays.append(np.ascontiguousarray(np.asarray(w, t.dtype.numpy)).reshape(t.shape))
        ys = [np.empty((length, *t.shape), t.dtype.numpy) for t in results[nc:]]
        b, top = self.tables.take()
        try:
            b.fill(arrays + ys)
            records, _, patches, n_patches = b.table(top)
            with one_blas_thread():
                drive(self.driver, records, patches[:n_patches].tolist(), length, self.reverse)
        finally:
            self.tables.give((b, top))
        return cs + ys


def _give_arenas(b: _Build) -> None:
    for prog, env in b.arenas:
        prog.give_arena(env)


class NestedWhile:
    """`while cond(carries, withs): carries = body(carries, withs)` where the test or the body
    has loops or branches of its own: one level whose steps run the test, BREAK, the body."""

    def __init__(self, cond, body, carries: int, types: list):
        self.cond, self.body, self.nc, self.types = cond, body, carries, types
        self.driver = loop_driver()
        self.segments: dict = {}  # the straight programs' records, made on the first call
        self.tables = TablePool(self._build)

    def _build(self):
        b = _Build()
        top = b.level(FOREVER, False)
        e = _Emit(b, self.segments)
        nc = self.nc
        ins = [Input(k) for k in range(len(self.types))]
        pred = Fixed(data_ptr(b.buffer((), np.bool_)))
        try:
            e.program(top, self.cond, ins, [pred])
            e.brk(top, pred, 0)
            e.carried(top, self.body, ins[:nc], ins[nc:], [], self.types[:nc])
            b.freeze()
        except BaseException:
            _give_arenas(b)
            raise
        return b, top

    def __call__(self, vals) -> list:
        nc = self.nc
        arrays = [
            np.array(v, t.dtype.numpy, order="C", copy=True).reshape(t.shape)
            for t, v in zip(self.types, vals)
        ]
        b, top = self.tables.take()
        try:
            b.fill(arrays)
            records, _, patches, n_patches = b.table(top)
            with one_blas_thread():
                drive(self.driver, records, patches[:n_patches].tolist(), FOREVER, False)
        finally:
            self.tables.give((b, top))
        return arrays[:nc]


def native_nested_while(cond, body, carries: int, fn) -> NestedWhile | str:
    """The while loop of compiled `cond` and `body` (either with control flow of its own) on
    the native driver, or why not (a str). `fn` is the body's IR Function (its types)."""
    why = _check(cond) or _check(body)
    if why:
        return why
    return NestedWhile(cond, body, carries, list(fn.param_types))


def native_nested_scan(body, carries: int, xs: int, reverse: bool, fn) -> NestedScan | str:
    """The scan of `body` (compiled with control flow of its own: it has `parts()`) on the
    native driver, or why not (a str). `fn` is the body's IR Function (its types)."""
    if not hasattr(body, "parts"):
        return "a body the native driver cannot run"
    why = _check(body)
    if why:
        return why
    return NestedScan(body, carries, xs, reverse, (fn.param_types, elements(fn.result_type)))


def _straight(prog) -> str | None:
    lp = loop_plan(prog.plan, 0, 0, swap=False)
    if isinstance(lp, str):
        return lp
    try:
        Segment(prog, lp)
    except NotNative as e:
        return str(e)
    return None


def _check(body) -> str | None:
    """Why a body with control flow cannot run natively (None: it can), found before a call:
    each straight program must have a native plan; regions are scans, whiles, conds and switches."""
    if not hasattr(body, "parts"):
        prog = getattr(body, "program", None)
        if prog is None or not hasattr(prog, "take_arena"):
            return "a body without a cpu program"
        return _straight(prog)
    _, steps, _ = body.parts()
    for step in steps:
        if step[0] == "piece":
            why = _check(step[1])
        else:
            _, inst, compiled, _ = step
            if inst.op not in ("scan", "while", "cond", "switch"):
                return f"a {inst.op} inside a loop body"
            why = next((w for w in map(_check, compiled) if w), None)
        if why:
            return why
    return None


__all__ = ["NestedScan", "NestedWhile", "native_nested_scan", "native_nested_while"]
