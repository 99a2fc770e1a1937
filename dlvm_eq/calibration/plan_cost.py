"""The predicted time of a planned program: each step of a kernel plan priced from the machine
(this host's measured profile, or the shipped defaults), plus the cost of calling the program.

    prediction = predict_plan(plan, "cpu")       # or a Machine
    prediction.seconds                           # the whole call
    print(prediction.table())                    # one line per step

The cost model of extraction prices e-nodes before fusion and planning; this prices what
actually runs, step by step, as the executor runs it:
- products (BlasStep, GemmStep, the products inside convolutions) by the measured products of
  the same layout and nearest shape (`product_seconds`), a batched product as its batch of
  small products sharing one call;
- generated kernels (maps, reductions, row kernels) by the bytes they move, on the grid of
  times measured for that step kind, plus each op's measured per-element cost;
- steps numpy runs (copies, concatenations, gathers, scatters, scans, the passes of windows)
  by their bytes on the grid measured for that kind (for windows: per op, beyond the products);
- an AliasStep moves nothing: only the executor's per-step cost, and on the CPU nothing at all
  when its source lives in the arena (`arena_aliases`: the view is made with the arena);
- every step (and the program's results) the view chains of its operands, applied at call
  time, by the measured cost of each view op (`view_cost.py`);
- and, on top of those (each measured with its data in cache), the share of each buffer a step
  touches that the caches have lost since it was last touched, by the bytes and seconds in
  between (`reuse.py`), at the measured cost of a byte from memory (`program_state.py`).
Without a measured grid for a kind, a step costs a launch plus its bytes at the machine's
bandwidth (times the passes the kind makes over them).

It lives in `calibration` because calibrating uses it (a window's measured passes are its time
less its predicted products) and because it reads both codegen's plans and extract's machine;
the pipeline (compile reports, `--measure`) and the benchmarks call it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..codegen.kernels import row_limit
from ..codegen.kernels.kernel_spec import KernelSpec, c_strides
from ..codegen.kernels.rows import RowSpec
from ..codegen.kernels.spec import DLVM_NAMES, DTYPES, Binary, Cast, Select, Unary, walk
from ..codegen.planning.attention import AttentionStep
from ..codegen.planning.gather import IndexStep, SliceScatterStep
from ..codegen.planning.plan import (
    AliasStep,
    BlasStep,
    ConcatStep,
    CopyStep,
    GemmStep,
    KernelStep,
    MapReduceStep,
    Plan,
    RowStep,
    View,
    arena_aliases,
)
from ..codegen.planning.scan import ScanStep
from ..codegen.planning.window import WindowStep
from ..codegen.runtime.conv_blocks import conv_dims, conv_work
from ..extract.attention_cost import attention_backward_seconds, attention_seconds
from ..extract.machine import Machine, interpolate, machine
from ..extract.target_cost import (
    INDEX_PASSES,
    TargetCost,
    batch_entries_seconds,
    flops_per_element,
)
from ..ir import window_ops
from ..ir.ops import OPS
from ..ir.types import DType, TensorType
from ..units import seconds_text
from .gemm_price import gemm_factor, row_scratch_of, runs_our_gemm
from .reuse import reuse
from .view_cost import VIEW_KINDS, chain_seconds, views_seconds

# bytes-moved passes of a kind without a measured grid (numpy's scatter-add is an unbuffered
# loop; a slice scatter fills then copies; a cumsum reads, adds and writes)
DEFAULT_PASSES = {
    "scatterAdd": INDEX_PASSES["ScatterAdd"],
    "sliceScatter": 2.0,
    "sliceScatter_rows": 2.0,
    "cumsum": 2.0,
    "take": INDEX_PASSES["Take"],
    **{op: 3.0 for op in window_ops.WINDOW_OPS},
}
_SHORT_TO_DLVM = {short: dlvm for dlvm, short in DLVM_NAMES.items()}


@dataclass(frozen=True)
class StepPrice:
    kind: str  # the step kind ("map", "product", "conv2d", ...)
    label: str  # what it computes, short
    seconds: float  # lost included
    lost: float = 0.0  # of the seconds: fetching data the caches lost since its last touch


@dataclass(frozen=True)
class PlanPrediction:
    name: str
    call: float  # calling the program, its steps aside
    steps: tuple[StepPrice, ...]
    priced_by: str  # "shipped defaults" or "measured profile <digest>"

    @property
    def seconds(self) -> float:
        return self.call + sum(s.seconds for s in self.steps)

    def table(self, measured: list[float] | None = None) -> str:
        """One line per step: its predicted seconds (and its measured ones, when given)."""
        lines = []
        for i, s in enumerate(self.steps):
            m = "" if measured is None else f"  measured {seconds_text(measured[i]):>10}"
            lost = f" (lost data {seconds_text(s.lost)})" if s.lost >= 5e-7 else ""
            lines.append(
                f"  {i:>3}  {s.kind:<20} predicted {seconds_text(s.seconds):>10}{m}  {s.label}{lost}"
            )
        return "\n".join(lines)


def predict_plan(plan: Plan, target: str | Machine = "cpu") -> PlanPrediction:
    """The predicted seconds of one call of `plan` on `target`'s machine."""
    mc = machine(target)
    made = (
        arena_aliases(plan) if mc.name == "cpu" else set()
    )  # views the CPU arena holds: never run
    steps = tuple(
        StepPrice("alias", "a view made with the arena", 0.0)
        if i in made
        else step_price(step, plan, mc)
        for i, step in enumerate(plan.steps)
    )
    if mc.cache:
        steps = _with_lost_data(plan, steps, mc)
    by = f"measured profile {mc.profile}" if mc.profile else "shipped defaults"
    # the results' views are applied once per call, after the steps
    call = mc.program_call + sum(chain_seconds(mc, r.chain) for r in plan.results)
    return PlanPrediction(plan.name, call, steps, by)


def step_price(step, plan: Plan, mc: Machine) -> StepPrice:
    """One step's predicted seconds (the executor's per-step cost included)."""
    price = _PRICES.get(type(step))
    if price is None:
        raise TypeError(
            f"no price for plan step {type(step).__name__}: add it to plan_cost._PRICES"
        )
    kind, label, seconds = price(step, plan, mc)
    return StepPrice(kind, label, mc.step_call + seconds + views_seconds(mc, step))


def _with_lost_data(plan: Plan, steps: tuple[StepPrice, ...], mc: Machine) -> tuple[StepPrice, ...]:
    """Each step with the fetching of the data the caches lost added: a buffer's lost share is
    the larger of the fractions measured for the bytes and for the seconds since its last
    touch (the seconds: the steps' own predictions, data in cache), on the curve measured with
    the probe nearest the buffer in size."""
    out = []
    for price, touches in zip(steps, reuse(plan, [p.seconds for p in steps])):
        lost = 0.0
        for nbytes, moved, spent in touches:
            c = cache_curve(mc, nbytes)
            lost += (
                nbytes
                * c.miss_seconds
                * max(lost_fraction(c.by_bytes, moved), lost_fraction(c.by_seconds, spent))
            )
        out.append(StepPrice(price.kind, price.label, price.seconds + lost, lost))
    return tuple(out)


def cache_curve(mc: Machine, nbytes: float):
    """The measured cache curve whose probe is nearest `nbytes` (log distance)."""
    return min(mc.cache, key=lambda c: abs(math.log(max(nbytes, 1.0) / c.probe_bytes)))


def lost_fraction(curve, amount: float) -> float:
    """The fraction lost after `amount` (bytes or seconds) on a measured curve ((amount,
    fraction), ...): linear between points, the last point's fraction beyond them."""
    if not curve:
        return 0.0
    if amount >= curve[-1][0]:
        return curve[-1][1]
    for (a0, f0), (a1, f1) in zip(curve, curve[1:]):
        if amount <= a1:
            return f0 + (f1 - f0) * (amount - a0) / (a1 - a0) if a1 > a0 else f1
    return curve[-1][1]  # pragma: no cover - amount < the last point is caught above


# ---------------------------------------------------------------- products


def product_seconds(
    mc: Machine,
    m: int,
    k: int,
    n: int,
    trans_a: bool = False,
    trans_b: bool = False,
    batch: int = 1,
) -> float:
    """Seconds of `batch` products (m, k) @ (k, n) in one call, operands transposed as flagged:
    from the measured products of that layout nearest in shape (log distance over m, k, n),
    each scaled to this product's flops beyond the cost of a call; without measurements, the
    machine's matmul formula."""
    flops = 2.0 * m * k * n
    points = mc.matmul_points
    # an entry with a dimension of 1 pays numpy's loop's call of one product (target_cost's)
    entries = batch_entries_seconds(batch, m, k, n)
    if not points:
        one = mc.matmul_seconds(m, k, n)
        return mc.launch + batch * max(one - mc.launch, flops / mc.blas_rate) + entries
    call = min(p.seconds for p in points)  # the smallest product: the call dominates
    layout = [p for p in points if (p.trans_a, p.trans_b) == (trans_a, trans_b)] or list(points)
    # k = 1 (an outer product) runs as a broadcasting multiply, without BLAS (gemm_runtime.
    # is_outer_product; numpy's own matmul loop took 100 us at 256x1x256, against 13 for
    # 256x2x256). Each regime is priced from its own products only (a k = 2 product next to a
    # measured outer product would otherwise be priced from a different kind of loop)
    same = (
        [p for p in layout if (p.k == 1) == (k == 1)]
        or [p for p in points if (p.k == 1) == (k == 1)]
        or layout
    )
    near = sorted(
        (
            (abs(math.log(m / p.m)) + abs(math.log(k / p.k)) + abs(math.log(n / p.n)), p)
            for p in same
        ),
        key=lambda dp: dp[0],
    )[:3]
    log_sum = weight_sum = 0.0
    for d, p in near:
        work = max(p.seconds - call, p.seconds * 0.05) * flops / p.flops
        w = 1.0 / (d + 0.05) ** 2
        log_sum += w * math.log(work)
        weight_sum += w
    return call + batch * math.exp(log_sum / weight_sum) + entries


def _transposed(v: View) -> bool:
    """Whether a product operand is read transposed (a `.T` view: a flag to BLAS)."""
    return any(op == "transpose" and tuple(p)[-2:] == (len(p) - 1, len(p) - 2) for op, p in v.chain)


def _product_dims(a: View, b: View, out_shape) -> tuple[int, int, int, int]:
    """(batch, m, k, n) of out = a @ b (1-D operands are a row or a column)."""
    k = a.shape[-1] if a.shape else 1
    m = a.shape[-2] if len(a.shape) >= 2 else 1
    n = b.shape[-1] if len(b.shape) >= 2 else 1
    batch = math.prod(out_shape[:-2]) if len(out_shape) > 2 else 1
    return max(batch, 1), max(m, 1), max(k, 1), max(n, 1)


def blas_price(step: BlasStep, plan: Plan, mc: Machine, blocks: dict | None = None):
    batch, m, k, n = _product_dims(step.a, step.b, step.out_shape(plan.slots))
    ta, tb = _transposed(step.a), _transposed(step.b)
    label = (f"{batch} x " if batch > 1 else "") + f"{m} x {k} x {n} {'TN'[not ta]}{'TN'[not tb]}"
    t, f = product_seconds(mc, m, k, n, ta, tb, batch), gemm_factor(mc, blocks)
    if f != 1.0 and plan.slots[step.out].dtype == "f32" and runs_our_gemm(batch, m, k, n):
        t = mc.launch + (t - mc.launch) * f  # ours under `blocks` as timed (gemm_price.py)
    return "product", label, t


def _gemm(step: GemmStep, plan: Plan, mc: Machine):
    _, label, t = blas_price(step.blas, plan, mc)
    # the epilogue runs on each tile while it is in cache: its ops and its other operands' bytes
    ep = step.epilogue
    n = math.prod(ep.spec.shape)
    extra = sum(plan.slots[s].nbytes for i, s in enumerate(ep.inputs) if i != step.c_input)
    extra += sum(plan.slots[s].nbytes for s in ep.outputs)
    return (
        "product+epilogue",
        label,
        t + n * _expr_flops(ep.spec.outputs, mc) / mc.flop_rate + extra / mc.bandwidth,
    )


# ---------------------------------------------------------------- generated kernels


def _egg(op: str) -> str:
    dlvm = _SHORT_TO_DLVM.get(op, op)
    spec = OPS.get(dlvm)
    return spec.egg if spec is not None else op


def _expr_flops(roots, mc: Machine) -> float:
    """Flop equivalents per element of an expression DAG (each shared node once, as LLVM's CSE
    evaluates it): the measured cost of each op class."""
    total = 0.0
    for e in walk(list(roots)):
        if isinstance(e, (Unary, Binary)):
            total += flops_per_element(_egg(e.op), mc)
        elif isinstance(e, (Select, Cast)):
            total += 1.0
    return total


# where the executor starts to split a kernel over threads, in MIN_PARALLEL_WORKs of work: a map
# from two (CpuKernel.run_map), a row kernel from two (its chunks), a reduction from one
# (CpuKernel.one_call_head)
SPLIT_FROM = {"map": 2, "rows": 2}


def _parallel(mc: Machine, kind: str, work: int) -> int:
    """Threads a generated kernel of `kind` is split over (its compute share), for `work`:
    its elements (a row kernel: elements times its passes, reductions and map)."""
    from ..codegen.runtime.threads import MIN_PARALLEL_WORK

    if mc.name != "cpu" or work < SPLIT_FROM.get(kind, 1) * MIN_PARALLEL_WORK:
        return 1
    from ..codegen.runtime.cpu_count import thread_count

    return thread_count()


def _moved(mc: Machine, kind: str, nbytes: float, elements: int, passes: float = 1.0) -> float:
    """Seconds of a step of `kind` moving `nbytes`: the measured grid of that kind, or a launch
    plus the bytes (times `passes`) at the machine's bandwidth."""
    grid = mc.step_grids.get(kind)
    if grid:
        return interpolate(grid, max(nbytes, 1.0))
    wake = mc.pool_wake if _parallel(mc, kind, elements) > 1 else 0.0
    return mc.launch + wake + passes * nbytes / mc.bandwidth


def _bound(mc: Machine, kind: str, nbytes: float, elements: int, compute: float) -> float:
    """Seconds of a generated kernel: its call, then the slower of moving its bytes and its
    arithmetic, which overlap (the loads of a vectorized loop are in flight while it computes;
    summing them priced a 4-multiply-add map over 1 MB at 112 us against 74 for the copy and 67
    measured, a 3-tanh one at 651 against 683 measured: the max gives 74 and 582). The call is
    the grid's smallest point (a kernel of 1K elements: call and dispatch), or a launch (and
    the pool's wake-up when the kernel is split over threads)."""
    moved = _moved(mc, kind, nbytes, elements)
    grid = mc.step_grids.get(kind)
    call = (
        grid[0][1]
        if grid
        else mc.launch + (mc.pool_wake if _parallel(mc, kind, elements) > 1 else 0.0)
    )
    return max(moved, call + compute)


def _read_bytes(plan: Plan, slots, elements: int, inputs) -> int:
    """Bytes a kernel reads: each input buffer once (a broadcast read: the buffer; a strided
    read of part of a buffer: the elements it visits)."""
    total = 0
    for s, inp in zip(slots, inputs):
        item = DTYPES[inp.dtype].itemsize
        total += min(plan.slots[s].nbytes, elements * item)
    return total


def _kernel(step: KernelStep, plan: Plan, mc: Machine):
    spec = step.spec
    n = math.prod(spec.shape)
    nbytes = _read_bytes(plan, step.inputs, n, spec.inputs) + sum(
        plan.slots[s].nbytes for s in step.outputs
    )
    if isinstance(spec, KernelSpec):
        kind, roots = "map", spec.outputs
    else:  # along the contiguous last axis (rows, or everything) or along leading axes only;
        # trailing axes of extent 1 are no axes (a sum of a 1024 x 1 column is a contiguous
        # sum: measured 2.5 us in logistic regression, where reduce_lead priced it 4.3)
        last = max((i for i, d in enumerate(spec.shape) if d > 1), default=-1)
        kind = "reduce" if last < 0 or last in spec.axes else "reduce_lead"
        roots = (spec.body,)
    compute = n * _expr_flops(roots, mc) / mc.flop_rate / _parallel(mc, kind, n)
    return kind, spec.name, _bound(mc, kind, nbytes, n, compute)


def _rows(step: RowStep, plan: Plan, mc: Machine, scratch: int | None = None):
    spec: RowSpec = step.spec
    n = spec.rows * spec.cols
    nbytes = row_bytes(
        _read_bytes(plan, step.inputs, n, spec.inputs),
        len(spec.reductions),
        bool(spec.outputs),
        sum(plan.slots[s].nbytes for s in step.outputs + step.reductions),
    )
    roots = [body for body, _, _ in spec.reductions] + list(spec.outputs)
    flops = _expr_flops(roots, mc)  # values shared by the passes kept (kernels/row_limit.py)
    if not row_limit.keeps(spec.cols, scratch or row_scratch_of(mc)):  # the map recomputes
        flops = _expr_flops(roots[: len(spec.reductions)], mc) + _expr_flops(spec.outputs, mc)
    work = n * (len(spec.reductions) + 1)  # what row_kernel splits into chunks
    compute = n * flops / mc.flop_rate / _parallel(mc, "rows", work)
    return "rows", spec.name, _bound(mc, "rows", nbytes, work, compute)


def _map_reduce(step: MapReduceStep, plan: Plan, mc: Machine):
    """A map-plus-reduction pass (planning/map_reduce.py): its inputs read once, its outputs and
    reductions written once; priced on the grid of the reductions it holds (along leading
    axes when one keeps the last axis), its arithmetic that of every output and reduction body."""
    spec = step.spec
    n = math.prod(spec.shape)
    nbytes = _read_bytes(plan, step.inputs, n, spec.inputs) + sum(
        plan.slots[s].nbytes for s in step.outputs + step.reductions
    )
    last = max((i for i, d in enumerate(spec.shape) if d > 1), default=-1)
    lead = any(last >= 0 and last not in axes for _, _, axes in spec.reductions)
    kind = "reduce_lead" if lead else "reduce"
    roots = list(spec.outputs) + [b for b, _, _ in spec.reductions]
    compute = n * _expr_flops(roots, mc) / mc.flop_rate / _parallel(mc, kind, n)
    return kind, spec.name, _bound(mc, kind, nbytes, n, compute)


def row_bytes(read: int, reductions: int, maps: bool, written: int) -> int:
    """Bytes a row kernel moves: its inputs once per pass over a row (each reduction, then the
    map), plus what it writes."""
    return read * (reductions + int(maps)) + written


# ---------------------------------------------------------------- steps numpy runs


def _out_bytes(step, plan: Plan) -> int:
    return plan.slots[step.out].nbytes


def _elements(step, plan: Plan) -> int:
    return math.prod(plan.slots[step.out].shape)


def _copy(step: CopyStep, plan: Plan, mc: Machine):
    b = _out_bytes(step, plan)
    src = step.src
    # a contiguous read (a reshaped or twice-transposed view) streams; any other view gathers
    kind = "copy" if src.strides == c_strides(src.shape) else "copy_strided"
    return kind, f"{b} B", _moved(mc, kind, 2 * b, _elements(step, plan))


def _concat(step: ConcatStep, plan: Plan, mc: Machine):
    b = _out_bytes(step, plan)
    return (
        "concat",
        f"{len(step.parts)} parts, {b} B",
        _moved(mc, "concat", 2 * b, _elements(step, plan)),
    )


def _alias(step: AliasStep, plan: Plan, mc: Machine):
    return "alias", "a view, no copy", 0.0


def _index(step: IndexStep, plan: Plan, mc: Machine):
    ids = plan.slots[step.ids.slot].nbytes
    # take reads the rows it gathers (as many as it writes); scatterAdd reads all of g
    read = _out_bytes(step, plan) if step.op == "take" else plan.slots[step.src.slot].nbytes
    b = read + ids + _out_bytes(step, plan)
    kind = step.op
    return kind, f"{b} B", _moved(mc, kind, b, _elements(step, plan), DEFAULT_PASSES.get(kind, 1.0))


# slices of at least this many contiguous elements (an outer axis) are copied as rows, shorter
# ones element by element: 393 KB moved, one thread, 7 us against 144 (a copy: 5.4). Priced on
# the strided grid, a depthwise convolution's zero-padding rows took 476 us (the whole program
# measured 461) and the guard rejected a 2.4x gain.
ROW_RUN = 16


def slice_scatter_kind(step: SliceScatterStep, plan: Plan) -> str:
    """ "sliceScatter_rows" where each slice is a contiguous run of ROW_RUN elements or more,
    "sliceScatter" (element-strided) otherwise."""
    inner = math.prod(plan.slots[step.out].shape[step.axis + 1 :])
    return "sliceScatter_rows" if inner >= ROW_RUN else "sliceScatter"


def _slice_scatter(step: SliceScatterStep, plan: Plan, mc: Machine):
    b = plan.slots[step.src.slot].nbytes + _out_bytes(step, plan)
    kind = slice_scatter_kind(step, plan)
    # a profile measured before row scatters were: they run as a copy of their bytes does
    grid = kind
    if kind == "sliceScatter_rows" and kind not in mc.step_grids and "copy" in mc.step_grids:
        grid = "copy"
    return kind, f"{b} B", _moved(mc, grid, b, _elements(step, plan), DEFAULT_PASSES[kind])


def _scan(step: ScanStep, plan: Plan, mc: Machine):
    b = 2 * _out_bytes(step, plan)
    return (
        "cumsum",
        f"{b} B",
        _moved(mc, "cumsum", b, _elements(step, plan), DEFAULT_PASSES["cumsum"]),
    )


# ---------------------------------------------------------------- windows: passes + products


def window_work(
    op: str, packed, in_shapes, out_shape, itemsize: int, blocks: dict | None = None
) -> tuple[float, list[tuple]]:
    """(bytes the window op's passes move, its products as (m, k, n, trans_a, trans_b, count)):
    the im2col matrix (every window element of the big NCHW tensor once) plus its operands and
    result; a convolution's products and transposing copies as conv_cpu runs them under
    `blocks` (codegen/runtime/conv_blocks.conv_work: per image, or per chunk and group)."""
    attrs = window_ops.unpack(op, packed)
    if op in ("conv2dBackwardInput", "avgPool2dBackward"):
        small = in_shapes[0]  # dY: the windows' positions
    elif op in ("conv2dBackwardWeight", "maxPool2dBackward"):
        small = in_shapes[1]
    else:
        small = out_shape
    big = (
        out_shape
        if op in ("conv2dBackwardInput", "maxPool2dBackward", "avgPool2dBackward")
        else in_shapes[0]
    )
    if op in window_ops.CONV_OPS:
        w = in_shapes[1] if op != "conv2dBackwardWeight" else out_shape
        kh, kw = w[2], w[3]
    else:
        kh, kw = attrs["kernel"]
    n, c, oh, ow = big[0], big[1], small[2], small[3]
    cols = n * c * kh * kw * oh * ow
    nbytes = itemsize * (cols + math.prod(out_shape) + sum(math.prod(s) for s in in_shapes))
    products: list = []
    if op in window_ops.CONV_OPS:  # as conv_cpu runs it under `blocks` (None: those in use)
        dims = conv_dims(op, in_shapes, out_shape)
        work = conv_work(op, *dims, attrs["groups"], itemsize, blocks)
        products, nbytes = list(work.products), nbytes + work.copy_bytes
    return nbytes, products


def window_products_seconds(mc: Machine, products) -> float:
    return sum(count * product_seconds(mc, m, k, n, ta, tb) for m, k, n, ta, tb, count in products)


def window_price(step: WindowStep, plan: Plan, mc: Machine, blocks: dict | None = None):
    """(kind, label, seconds) of a window step, a convolution under `blocks` (None: in use)."""
    out = plan.slots[step.out]
    shapes, itemsize = [v.shape for v in step.inputs], DTYPES[out.dtype].itemsize
    nbytes, products = window_work(step.op, step.packed, shapes, out.shape, itemsize, blocks)
    passes = _moved(mc, step.op, nbytes, math.prod(out.shape), DEFAULT_PASSES[step.op])
    label = " ".join(map(str, out.shape))
    return step.op, f"-> {label}", passes + window_products_seconds(mc, products)


def _attention(step: AttentionStep, plan: Plan, mc: Machine):
    """The fused attention kernel: priced as extraction prices its e-node (attention_cost.py)."""
    out = plan.slots[step.out]
    dt = DType(out.dtype)
    types = [TensorType(tuple(v.shape), dt) for v in step.inputs[:3]]
    t = TensorType(tuple(out.shape), dt)
    if step.grads:  # the three results of one kernel
        seconds = 3 * attention_backward_seconds(
            TargetCost(mc, {}), t, lambda i: types[i], step.causal
        )
        return "attentionBackward", "-> " + " ".join(map(str, out.shape)), seconds
    seconds = attention_seconds(TargetCost(mc, {}), t, lambda i: types[i], step.causal)
    return "attention", "-> " + " ".join(map(str, out.shape)), seconds


_PRICES = {
    KernelStep: _kernel,
    RowStep: _rows,
    MapReduceStep: _map_reduce,
    BlasStep: blas_price,
    GemmStep: _gemm,
    CopyStep: _copy,
    ConcatStep: _concat,
    AliasStep: _alias,
    IndexStep: _index,
    SliceScatterStep: _slice_scatter,
    ScanStep: _scan,
    WindowStep: window_price,
    AttentionStep: _attention,  # issue 33
}

STEP_KINDS = (
    (
        "map",
        "reduce",
        "reduce_lead",
        "rows",
        "copy",
        "copy_strided",
        "concat",
        "take",
        "scatterAdd",
        "sliceScatter",
        "sliceScatter_rows",
        "cumsum",
    )
    + window_ops.WINDOW_OPS
    + VIEW_KINDS
)  # the kinds calibration measures a grid for

__all__ = [
    "PlanPrediction",
    "STEP_KINDS",
    "StepPrice",
    "blas_price",
    "cache_curve",
    "lost_fraction",
    "predict_plan",
    "product_seconds",
    "row_bytes",
    "step_price",
    "window_price",
    "window_products_seconds",
    "window_work",
]
