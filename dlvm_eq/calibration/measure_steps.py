"""The time of each kind of plan step, over a range of sizes, as the executor runs it: tiny
plans of one step built directly (no e-graph, no planner), compiled with `codegen.program` and
timed like any compiled call. What `plan_cost.py` prices planned programs with.

    call, step = call_overheads()                  # a program call; one step's bookkeeping
    grids = step_grids(mc, call, step)             # kind -> ((bytes moved, seconds), ...)

Each grid point is the step's own seconds as the executor times it inside a call
(`time_step`), less the per-step cost that `plan_cost` adds to every step. A window step's point is its time less its products as `plan_cost` prices them
on `mc` (the products measured just before), so that the grid holds its passes only (im2col,
col2im, the pool's reads), measured, whatever today's window code does.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from ..codegen import KernelInput, KernelSpec, Load, ReduceSpec, RowSpec, program
from ..codegen.kernels.kernel_spec import c_strides
from ..codegen.planning.gather import IndexStep, SliceScatterStep
from ..codegen.planning.plan import (
    ALIAS,
    OUTPUT,
    PARAM,
    TEMP,
    AliasStep,
    ConcatStep,
    CopyStep,
    KernelStep,
    Plan,
    RowStep,
    Slot,
    View,
)
from ..codegen.planning.scan import ScanStep
from ..codegen.planning.window import WindowStep
from ..extract.machine import MACHINES, Machine
from ..ir import window_ops
from ..ir.types import F32, TensorType
from .measure import fastest_seconds, per_call
from .plan_cost import row_bytes, window_products_seconds, window_work
from .view_cost import VIEW_OPS, views_seconds

# elements: L1, L2, L3 (32 MB here: 2^21 elements, 16 MB moved, is in it, and a map over it ran
# at 219 us where the grid without that point interpolated 836 between 4 MB and 33 MB), beyond
SIZES = tuple(1 << p for p in (10, 13, 16, 19, 21, 22))
# on a GPU: one block's worth, the L2's (50 MiB on an H100/H200: 2^22 elements moved twice), beyond
GPU_SIZES = tuple(1 << p for p in (10, 14, 18, 22, 24, 26))
COLS = 256  # row length of the 2-D steps
# window ops timed at (batch, channels in, height = width, channels out): a small CNN's layers
WINDOW_SIZES = ((4, 4, 8, 8), (32, 1, 16, 32), (32, 16, 14, 32), (64, 32, 14, 64))
FLOOR = 1e-8  # a grid time is positive
WINDOW_SWEEPS = 2  # window points: the fastest of this many sweeps


def c_view(slot: int, shape) -> View:
    return View(slot, tuple(shape), c_strides(tuple(shape)))


def tiny_plan(
    name, params: list[tuple], outputs: list[tuple], steps, temps: list[tuple] = (), aliases=0
) -> Plan:
    """A plan over slots: params then outputs then temporaries (each a (shape, dtype)), its
    first output returned."""
    slots, offsets, offset = [], {}, 0
    for role, group in ((PARAM, params), (OUTPUT, outputs), (TEMP, temps)):
        for shape, dtype in group:
            slot = Slot(len(slots), tuple(shape), dtype, role, f"a{len(slots)}")
            if role == TEMP:
                offsets[slot.index] = offset
                offset += -(-slot.nbytes // 64) * 64
            slots.append(slot)
    for _ in range(aliases):
        slots.append(Slot(len(slots), params[0][0], params[0][1], ALIAS, f"a{len(slots)}"))
    first_out = len(params)
    return Plan(
        name,
        slots,
        list(range(len(params))),
        list(steps),
        [c_view(first_out, slots[first_out].shape)],
        False,
        offsets=offsets,
        arena_bytes=offset,
    )


def time_call(prog, args) -> float:
    """Fastest seconds of prog(*args) (measure.fastest_seconds), short calls timed in batches
    of about a millisecond (a GPU program's batch ends when the device is done)."""
    cp = getattr(prog, "cp", None)
    sync = cp.cuda.runtime.deviceSynchronize if cp is not None else (lambda: None)

    def call():
        prog(*args)
        sync()

    call()
    t0 = time.perf_counter()
    call()
    once = time.perf_counter() - t0
    calls = max(1, min(2000, int(1e-3 / max(once, 1e-7))))

    run = per_call(lambda: prog(*args), calls)

    def batch():
        run()
        sync()

    return fastest_seconds(batch, repeats=7, cap_s=0.15) / calls


def time_step(prog, args, cap_s: float = 0.15, most: int = 200) -> float:
    """Seconds of a one-step program's step, as the executor times it inside a call
    (`CpuProgram.timed_call`): the lower quartile of up to `most` calls within `cap_s` (calls
    another process interrupted are the slow ones; the quartile keeps the cold-cache cost a
    step has inside a program, which the fastest call would hide)."""
    prog(*args)
    times, spent = [], 0.0
    while len(times) < most and (len(times) < 5 or spent < cap_s):
        t0 = time.perf_counter()
        times.append(prog.timed_call(*args)[1][0])
        spent += time.perf_counter() - t0
    times.sort()
    return times[len(times) // 4]


def call_overheads(target: str = "cpu") -> tuple[float, float]:
    """(seconds of a compiled program's call with one step that does nothing, a view; the
    extra seconds of each further such step)."""
    x = np.ones(8, np.float32)
    times = {}
    for k in (1, 17):
        steps = [AliasStep(0, 2 + i, 0) for i in range(k)]
        plan = tiny_plan(f"calib_call_{k}", [((8,), "f32")], [((8,), "f32")], steps, aliases=k)
        times[k] = time_call(program(plan, target), [x])
    step = max(0.0, (times[17] - times[1]) / 16)
    return max(FLOOR, times[1] - step), step


# ---------------------------------------------------------------- one plan per (kind, size)


def _rows_cols(n: int) -> tuple[int, int]:
    return max(1, n // COLS), COLS


def _map(n):
    spec = KernelSpec(f"calib_map_{n}", (n,), [KernelInput("f32")], [Load(0) + 1.0])
    return (
        tiny_plan(spec.name, [((n,), "f32")], [((n,), "f32")], [KernelStep(spec, (0,), (1,))]),
        [np.ones(n, np.float32)],
        8 * n,
    )


def _reduce(n):
    r, c = _rows_cols(n)
    spec = ReduceSpec(f"calib_reduce_{n}", (r, c), [KernelInput("f32")], Load(0), "add", (1,))
    return (
        tiny_plan(spec.name, [((r, c), "f32")], [((r,), "f32")], [KernelStep(spec, (0,), (1,))]),
        [np.ones((r, c), np.float32)],
        4 * (r * c + r),
    )


def _reduce_lead(n):
    r, c = _rows_cols(n)
    spec = ReduceSpec(f"calib_reduce_lead_{n}", (r, c), [KernelInput("f32")], Load(0), "add", (0,))
    return (
        tiny_plan(spec.name, [((r, c), "f32")], [((c,), "f32")], [KernelStep(spec, (0,), (1,))]),
        [np.ones((r, c), np.float32)],
        4 * (r * c + c),
    )


def _rows(n):
    r, c = _rows_cols(n)
    x = Load(0)
    spec = RowSpec(f"calib_rows_{n}", r, c, [KernelInput("f32")], [(x, "max", None)], [x - Load(1)])
    plan = tiny_plan(
        spec.name,
        [((r, c), "f32")],
        [((r, c), "f32")],
        [RowStep(spec, (0,), (1,), (2,))],
        temps=[((r,), "f32")],
    )
    return plan, [np.ones((r, c), np.float32)], row_bytes(4 * r * c, 1, True, 4 * (r * c + r))


def _copy(n):
    r, c = _rows_cols(n)
    return (
        tiny_plan(
            f"calib_copy_{n}",
            [((r, c), "f32")],
            [((r, c), "f32")],
            [CopyStep(c_view(0, (r, c)), 1)],
        ),
        [np.ones((r, c), np.float32)],
        8 * r * c,
    )


def _copy_strided(n):
    r, c = _rows_cols(n)
    src = View(0, (c, r), (1, c), (("transpose", (1, 0)),))  # materializing a transpose
    return (
        tiny_plan(f"calib_transpose_{n}", [((r, c), "f32")], [((c, r), "f32")], [CopyStep(src, 1)]),
        [np.ones((r, c), np.float32)],
        8 * r * c,
    )


def _concat(n):
    r, c = _rows_cols(n)
    h = c // 2
    step = ConcatStep((c_view(0, (r, h)), c_view(1, (r, h))), 1, 2)
    return (
        tiny_plan(
            f"calib_concat_{n}", [((r, h), "f32"), ((r, h), "f32")], [((r, c), "f32")], [step]
        ),
        [np.ones((r, h), np.float32)] * 2,
        8 * r * c,
    )


def _take(n):
    d, vocab = 64, 1024
    b = max(1, n // d)
    ids = np.random.default_rng(0).integers(0, vocab, b).astype(np.int32)
    step = IndexStep("take", c_view(0, (vocab, d)), c_view(1, (b,)), 0, vocab, 2)
    plan = tiny_plan(
        f"calib_take_{n}", [((vocab, d), "f32"), ((b,), "i32")], [((b, d), "f32")], [step]
    )
    return plan, [np.ones((vocab, d), np.float32), ids], 4 * (2 * b * d + b)


def _scatter_add(n):
    d, vocab = 64, 1024
    b = max(1, n // d)
    ids = np.random.default_rng(0).integers(0, vocab, b).astype(np.int32)
    step = IndexStep("scatterAdd", c_view(0, (b, d)), c_view(1, (b,)), 0, vocab, 2)
    plan = tiny_plan(
        f"calib_scatter_{n}", [((b, d), "f32"), ((b,), "i32")], [((vocab, d), "f32")], [step]
    )
    return plan, [np.ones((b, d), np.float32), ids], 4 * (b * d + b + vocab * d)


def _slice_scatter(n):
    r, c = _rows_cols(n)
    step = SliceScatterStep(c_view(0, (r, c // 2)), 1, 0, 2, 1)
    plan = tiny_plan(f"calib_slicescatter_{n}", [((r, c // 2), "f32")], [((r, c), "f32")], [step])
    return plan, [np.ones((r, c // 2), np.float32)], 4 * (r * c // 2 + r * c)


def _slice_scatter_rows(n):
    """Every other row of (r, COLS): slices that are contiguous rows (plan_cost.ROW_RUN)."""
    r, c = _rows_cols(n)
    r = max(2, r)
    step = SliceScatterStep(c_view(0, (r // 2, c)), 0, 0, 2, 1)
    plan = tiny_plan(
        f"calib_slicescatter_rows_{n}", [((r // 2, c), "f32")], [((r, c), "f32")], [step]
    )
    return plan, [np.ones((r // 2, c), np.float32)], 4 * (r // 2 * c + r * c)


def _cumsum(n):
    r, c = _rows_cols(n)
    step = ScanStep(c_view(0, (r, c)), 1, False, 1)
    return (
        tiny_plan(f"calib_cumsum_{n}", [((r, c), "f32")], [((r, c), "f32")], [step]),
        [np.ones((r, c), np.float32)],
        8 * r * c,
    )


KINDS = {
    "map": _map,
    "reduce": _reduce,
    "reduce_lead": _reduce_lead,
    "rows": _rows,
    "copy": _copy,
    "copy_strided": _copy_strided,
    "concat": _concat,
    "take": _take,
    "scatterAdd": _scatter_add,
    "sliceScatter": _slice_scatter,
    "sliceScatter_rows": _slice_scatter_rows,
    "cumsum": _cumsum,
}


# ---------------------------------------------------------------- view ops

VIEW_SIDE = 8  # views of an 8 x 8 array: the copy behind them is next to nothing


def view_plan(op: str | None):
    """(plan, args) copying an 8 x 8 array read through one view op (None: a plain copy)."""
    s = VIEW_SIDE
    src_shape, out, view = {
        None: ((s, s), (s, s), c_view(0, (s, s))),
        "transpose": ((s, s), (s, s), View(0, (s, s), (1, s), (("transpose", (1, 0)),))),
        "reshape": ((s, s), (s * s,), View(0, (s * s,), (1,), (("reshape", (s * s,)),))),
        "broadcast": ((), (s, s), View(0, (s, s), (0, 0), (("broadcast", (s, s)),))),
        "slice": ((s, 2 * s), (s, s), View(0, (s, s), (2 * s, 1), (("slice", (1, 0, s)),))),
        "strided": ((s * s,), (s, s), View(0, (s, s), (s, 1), (("strided", ((s, s), (s, 1))),))),
    }[op]
    plan = tiny_plan(
        f"calib_view_{op or 'none'}", [(src_shape, "f32")], [(out, "f32")], [CopyStep(view, 1)]
    )
    return plan, [np.ones(src_shape, np.float32)]


def view_grids(target: str = "cpu") -> dict:
    """view_<op> -> ((1, seconds),): what reading an operand through that view op adds to a
    step, as the executor runs it (a copy through the view less the plain copy)."""
    plain = time_step(program(view_plan(None)[0], target), view_plan(None)[1])
    grids = {}
    for op in VIEW_OPS:
        plan, args = view_plan(op)
        grids[f"view_{op}"] = ((1.0, max(FLOOR, time_step(program(plan, target), args) - plain)),)
    return grids


# ---------------------------------------------------------------- windows


def window_case(op: str, n: int, c: int, hw: int, o: int):
    """(input shapes, attrs, output shape) of window op `op` on a layer of that size: 3x3
    convolutions padded by 1, 2x2 pools of stride 2."""
    x = (n, c, hw, hw)
    if op in window_ops.CONV_OPS:
        attrs = {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1}
        w, y = (o, c, 3, 3), (n, o, hw, hw)
        ins = {"conv2d": (x, w), "conv2dBackwardInput": (y, w), "conv2dBackwardWeight": (x, y)}[op]
        if op != "conv2d":
            attrs["size"] = (hw, hw) if op == "conv2dBackwardInput" else (3, 3)
    else:
        attrs = {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0, 0, 0)}
        y = (n, c, hw // 2, hw // 2)
        ins = {
            "maxPool2d": (x,),
            "avgPool2d": (x,),
            "maxPool2dBackward": (x, y),
            "maxPool2dGather": (x, x),
            "avgPool2dBackward": (y,),
        }[op]
        if op == "avgPool2dBackward":
            attrs["size"] = (hw, hw)
    out = window_ops.result_type(op, [TensorType(s, F32) for s in ins], attrs).shape
    return ins, attrs, out


def window_plan(op: str, size):
    ins, attrs, out = window_case(op, *size)
    packed = window_ops.pack(op, attrs)
    step = WindowStep(op, packed, tuple(c_view(i, s) for i, s in enumerate(ins)), len(ins))
    plan = tiny_plan(f"calib_{op}_{size[0]}", [(s, "f32") for s in ins], [(out, "f32")], [step])
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ins]
    nbytes, products = window_work(op, packed, ins, out, 4)
    return plan, args, nbytes, products


def step_grids(
    mc: Machine, step: float, sizes=SIZES, window_sizes=WINDOW_SIZES, target: str = "cpu"
) -> dict:
    """kind -> ((bytes moved, the step's seconds), ...) for every kind `plan_cost` prices by a
    grid; `mc` prices the products inside windows (its measured products). Each point is the
    step's time less the views its plan reads through (priced from the view grids, measured
    first), which plan_cost adds to every step."""
    grids = kind_grids(step, sizes, target)
    return {
        **grids,
        **window_grids(
            dataclasses.replace(mc, step_grids={**mc.step_grids, **grids}),
            step,
            window_sizes,
            target,
        ),
    }


def kind_grids(step: float, sizes=SIZES, target: str = "cpu") -> dict:
    """The view grids and the grid of every kind in KINDS (step_grids but the windows: these
    need no products, so calibrate times them between two sweeps of the products)."""
    grids: dict[str, tuple] = view_grids(target)
    views = dataclasses.replace(MACHINES[target], step_grids=dict(grids))  # prices the views
    for kind, build in KINDS.items():
        points = []
        for n in sizes:
            plan, args, nbytes = build(n)
            t = time_step(program(plan, target), args) - views_seconds(views, plan.steps[0])
            points.append((float(nbytes), max(FLOOR, t - step)))
        grids[kind] = tuple(points)
    return grids


def window_grids(mc: Machine, step: float, window_sizes=WINDOW_SIZES, target: str = "cpu") -> dict:
    """window op -> its grid: each point the step's time beyond its products as `mc` prices
    them (its measured products) and its views (`mc`'s view grids)."""
    grids: dict[str, tuple] = {}
    # windows (milliseconds each, split over the cores: the steps another process disturbs
    # most, 5-10x under a load of 4) in WINDOW_SWEEPS sweeps, each point its fastest
    cases = [(op, window_plan(op, size)) for op in window_ops.WINDOW_OPS for size in window_sizes]
    progs = [program(plan, target) for _, (plan, _, _, _) in cases]
    best = [math.inf] * len(cases)
    for _ in range(WINDOW_SWEEPS):
        best = [
            min(b, time_step(prog, args))
            for b, prog, (_, (_, args, _, _)) in zip(best, progs, cases)
        ]
    for op in window_ops.WINDOW_OPS:
        points = []
        for (case_op, (plan, _, nbytes, products)), t in zip(cases, best):
            if case_op != op:
                continue
            t = t - step - views_seconds(mc, plan.steps[0])
            products_s = window_products_seconds(mc, products)
            # the passes: what the step takes beyond its products (at least a tenth of it:
            # products priced a little high must not leave a negative pass)
            points.append((float(nbytes), max(FLOOR, t - products_s, 0.1 * t)))
        grids[op] = tuple(sorted(points))
    return grids


__all__ = [
    "GPU_SIZES",
    "KINDS",
    "c_view",
    "call_overheads",
    "kind_grids",
    "step_grids",
    "time_call",
    "time_step",
    "tiny_plan",
    "view_grids",
    "view_plan",
    "window_case",
    "window_grids",
    "window_plan",
]
