"""IR Function -> kernel plan: which values are fused into which kernels.

    plan = plan_flat(flat, "f", decide_fusion(flat))     # dlvm_eq.pipeline.plan_function does this
    print(plan)        # kernels (with the IR values each computes), BLAS calls, buffers

The rules, in the order they apply:
- Elementwise ops (any arity, casts, compares, select), scalar literals and layout ops on
  unmaterialized values become one scalar expression per kernel output; implicit and explicit
  broadcasts, transposes and shape casts become strided reads (`views.py`), never copies.
- Which values are materialized (written to a buffer) is not decided here: the fusion stage
  (egraph/fusion_decision.py) loads the function into an e-graph where every elementwise value is also
  a `Map` of scalar ops and every read of it may recompute it (rules/fusion.egg), and
  extraction (extract/fusion_cost.py) picks the materialized set by a kernel cost model:
  results, BLAS, concatenate and slice operands and reductions are forced; a value kept in a buffer
  costs its kernel once, a value inlined costs its work in every kernel that reads it.
  Everything not chosen is recomputed where it is read. `plan.fusion` says what was chosen.
- Materialized values of the same iteration space form one multi-output kernel when that does
  not create a cycle and the kernel stays under MAX_KERNEL_NODES expression nodes; a value
  read element-for-element by a sibling output is computed once.
- A reduction fuses its producer into its body; `dot` is a BLAS call with transposed operands
  passed as views; `concatenate` and copies of views go through numpy/CuPy (a concatenation
  read only by a concatenation along the same axis is copied by that one: `spliced_concats`);
  a `slice` is read in place (an alias of its operand's memory from its first element,
  plan.AliasStep).
- A map and the reductions over trailing axes it reads become one row kernel (`rowfusion.py`:
  softmax, log-softmax, layer norm read their rows from memory once): on the CPU for any row
  length, on the GPU (one thread per row, `llvm_ptx._rows_kernel`) for rows of at most
  GPU_ROW_COLS elements.
- On the CPU a batched product whose only reader is a copy permuting its axes (attention's
  head merge) writes that layout itself (`product_layout.py`): the copy is gone.
- On the CPU a concatenation whose parts are temporaries written by products or kernels and
  read by nothing else is written in place (`concat_in_place.py`): each producer writes its
  slice of the concatenation's buffer, and the copy is gone.
- Steps are ordered topologically, kernels before BLAS calls, and temporaries are placed in
  one arena by liveness (`steps_order.py`).

Files: ir/inline.py (apply/tuples), planner (this: values -> kernels), rowfusion, steps_order.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import window_ops
from ...ir.inline import Flat
from ...ir.module import Const as IRConst
from ...ir.module import Instruction
from ..kernels.kernel_spec import c_strides
from ..kernels.rows import loads, rebuild
from ..kernels.spec import DTYPES, REDUCE_INIT, Cast, Const, Expr, Load, Select, binary, unary
from .attention import plan_attention
from .concat_in_place import write_concats_in_place
from .epilogue import fuse_epilogues
from .gather import IndexStep, SliceScatterStep
from .kernel_groups import KernelGrouping
from .map_reduce import MapReduceFusion
from .plan import (
    ALIAS,
    CONST,
    OUTPUT,
    PARAM,
    TEMP,
    AliasStep,
    BlasStep,
    ConcatStep,
    CopyStep,
    GemmStep,
    KernelStep,
    MapReduceStep,
    Plan,
    PlanError,
    RowStep,
    Slot,
    View,
    WindowStep,
    step_inputs,
    step_outputs,
)
from .plan_queries import (
    layout_view_map,
    operand_name,
    readers,
    renamed_kernel,
    spliced_concats,
    value_kind,
    view_of,
)
from .product_layout import write_in_reader_layout
from .rowfusion import RowFusion
from .scan import ScanStep
from .shared_values import SharedValues
from .steps_order import Node, arena, schedule
from .values import EwOut, Fused, Konst, Mat, ReduceNode, SlotInfo
from .views import (
    NoView,
    broadcast_strides,
    is_contiguous,
)

# ------------------------------------------------------------------ the planner

# Row kernels on the GPU run one thread per row (no barriers): only for short rows, whose warp
# reads share a few cache lines; longer rows stay a reduction kernel and a map kernel.
GPU_ROW_COLS = 64


def rows_for(target: str) -> bool | int:
    """The `rows` argument of plan_function for a target: any row length on the CPU, short
    rows on the GPU."""
    return True if target == "cpu" else GPU_ROW_COLS


def fusion_rows(rows: bool | int) -> bool:
    """The `rows` argument of the fusion decision for the planner's `rows`: its cost model
    counts trailing reductions into row kernels only where all of them may be (any length)."""
    return rows is True


def plan_flat(
    flat: Flat, name: str, fusion, rows: bool | int = True, target: str | None = None
) -> Plan:
    """The kernel plan of a flattened IR function (`ir.inline.flatten`), given the fusion
    decision for it (`egraph.fusion_decision.decide_fusion(flat, target, rows=fusion_rows(rows))`:
    its `materialize`, `same_as` and `report`). rows: fuse reductions over trailing axes with
    the map that reads them into row kernels: True for rows of any length, an int for rows of
    at most that many elements (the gpu target: `rows_for`), False for none. target: the
    machine the decision was costed for. `dlvm_eq.pipeline.plan_function` does all of it."""
    return _Planner(flat, name, fusion, rows, target or "cpu").build()


class _Planner(KernelGrouping, RowFusion, MapReduceFusion, SharedValues):
    def __init__(
        self, flat: Flat, name: str, decision, rows: bool | int = True, target: str = "cpu"
    ):
        self.flat, self.name, self.target = flat, name, target
        self.decision = decision  # the fusion stage's FusionDecision (egraph/fusion_decision.py)
        self.rows = rows is True or (rows is not False and int(rows) > 0)
        self.row_limit = None if rows is True else int(rows)  # longest row a row kernel takes
        self.fusion = None  # the fusion stage's report (egraph/fusion_decision.py)
        self.same_as: dict = {}  # id(value) -> an earlier value it equals (the e-graph's)
        self.slots: list[SlotInfo] = []
        self.leaves: list[tuple[int, tuple]] = []
        self.leaf_ids: dict[tuple[int, tuple], int] = {}
        self.ew: list[EwOut] = []
        self.ew_by_slot: dict[int, EwOut] = {}
        self.reductions: list[ReduceNode] = []
        self.steps: list = []  # BlasStep / ConcatStep / CopyStep
        self.constants: dict[int, np.ndarray] = {}
        self.row_constants: dict[tuple, int] = {}  # rowfusion.row_constant's, made once each
        self.refs: dict[int, object] = {}
        self.op_of: dict[str, str] = {}  # IR value name -> op (kernel names)
        self.pos_of: dict[str, int] = {}
        self.spliced: dict[
            int, list
        ] = {}  # id(value) -> its parts: a concatenation copied by its reader
        self.producer: dict[int, Instruction] = {id(i.result): i for i in flat.body}
        self.readers = readers(flat)  # id(value) -> its readers (None: a function result)
        self.reduce_of: dict[int, ReduceNode] = {}  # id(value) -> the reduction computing it
        self.value_named: dict[str, object] = {}  # IR value name -> Value (shared_values.py)
        self.written_exprs: dict[tuple, dict] = {}  # shape -> expression -> slot written

    # -- slots and leaves
    def new_slot(self, shape, dtype: str, role: str, name: str = "") -> int:
        self.slots.append(SlotInfo(tuple(shape), dtype, role, name))
        return len(self.slots) - 1

    def leaf(self, slot: int, strides: tuple) -> Load:
        key = (slot, tuple(strides))
        i = self.leaf_ids.get(key)
        if i is None:
            i = self.leaf_ids[key] = len(self.leaves)
            self.leaves.append(key)
        return Load(i)

    # -- what to materialize: the fusion stage's extraction decides
    def decide(self) -> set[int]:
        """ids of the values to materialize, chosen by extraction from the fusion e-graph
        (egraph/fusion_decision.py, rules/fusion.egg, extract/fusion_cost.py) and handed to the planner."""
        decision = self.decision
        self.fusion, self.same_as = decision.report, decision.same_as
        return decision.materialize

    # -- expressions
    def operand_expr(self, ref, shape) -> Expr:
        """`ref` read at every element of `shape` (numpy broadcasting)."""
        if isinstance(ref, Konst):
            return Const(ref.value, ref.dtype)
        if isinstance(ref, Mat):
            return self.leaf(ref.slot, broadcast_strides(ref.strides, ref.shape, shape))
        if tuple(ref.shape) == tuple(shape):
            return ref.expr
        return self.reindex(ref.expr, lambda st: broadcast_strides(st, ref.shape, shape))

    def reindex(self, expr: Expr, fn) -> Expr:
        """`expr` read through a layout map: every leaf's strides st become fn(st) (None:
        not expressible, NoView)."""
        repl = {}
        for ld in loads(expr):
            slot, st = self.leaves[ld.index]
            st2 = fn(st)
            if st2 is None:
                raise NoView()
            repl[ld] = self.leaf(slot, st2)
        return rebuild(expr, repl)

    def materialize(self, ref, name: str, order: int, role: str = TEMP) -> Mat:
        if isinstance(ref, Mat):
            return ref
        if isinstance(ref, Konst):
            expr, names = Const(ref.value, ref.dtype), frozenset()
        else:  # what another kernel already writes is read, not recomputed (shared_values.py)
            expr, names = self.loaded_if_written(ref.expr, ref.shape), ref.names
        slot = self.new_slot(ref.shape, ref.dtype, role, name)
        out = EwOut(name, expr, tuple(ref.shape), ref.dtype, slot, order, names | {name})
        if not isinstance(ref, Konst):
            self.note_written(ref.expr, out)
        self.ew.append(out)
        self.ew_by_slot[slot] = out
        return Mat(slot, tuple(ref.shape), ref.dtype, c_strides(tuple(ref.shape)))

    # -- the forward pass
    def build(self) -> Plan:
        flat = self.flat
        materialize = self.decide()
        # a value the e-graph found equal to a later one is read through it: never spliced
        # (nor merged into its reader: others read it too)
        self.read_through = {id(v) for v in self.same_as.values()}
        self.splice = spliced_concats(flat, self.readers) - self.read_through
        params = []
        for p in flat.params:
            s = self.new_slot(p.type.shape, str(p.type.dtype), PARAM, p.name)
            params.append(s)
            self.refs[id(p)] = Mat(s, p.type.shape, str(p.type.dtype), c_strides(p.type.shape))
        for order, inst in enumerate(flat.body):
            self.op_of[inst.result.name], self.pos_of[inst.result.name] = inst.op, order
            self.value_named[inst.result.name] = inst.result
            same = self.same_as.get(id(inst.result))
            if same is not None:  # equal to an earlier value (one e-class): computed once
                self.refs[id(inst.result)] = self.refs[id(same)]
                continue
            ref = self.instruction(inst, order)
            if ref is None:  # a spliced concatenation: its reader copies its parts
                continue
            if id(inst.result) in materialize and not isinstance(ref, Mat):
                ref = self.materialize(ref, inst.result.name, order)
            elif isinstance(ref, Fused) and self.too_long(ref):  # split: shared_values.py
                self.keep_shared(ref, inst.result.name)
                ref = self.materialize(ref, inst.result.name, order)
            self.refs[id(inst.result)] = ref
        results = self.results(len(flat.body))
        self.results_views = results
        return self.finish(params, results)

    def ref_of(self, o):
        if isinstance(o, IRConst):
            return Konst(o.value, str(o.type.dtype), ())
        return self.refs[id(o)]

    def instruction(self, inst: Instruction, order: int):
        kind = value_kind(inst)
        t = inst.result.type
        name = inst.result.name
        if kind == "ew":
            return self.elementwise(inst)
        if kind == "const":
            return Konst(np.asarray(inst.attrs["value"]).item(), str(t.dtype), t.shape)
        if kind == "literal":
            slot = self.new_slot(t.shape, str(t.dtype), CONST, name)
            self.constants[slot] = np.ascontiguousarray(
                np.asarray(inst.attrs["value"], dtype=DTYPES[str(t.dtype)]).reshape(t.shape)
            )
            return Mat(slot, t.shape, str(t.dtype), c_strides(t.shape))
        if kind == "view":
            return self.view(inst, order)
        if kind == "reduce":
            return self.reduce(inst, order)
        if kind == "dot":
            a, b = (self.materialize(self.ref_of(o), operand_name(o), order) for o in inst.operands)
            out = self.new_slot(t.shape, str(t.dtype), TEMP, name)
            self.steps.append(BlasStep(view_of(a), view_of(b), out, name, order))
            return Mat(out, t.shape, str(t.dtype), c_strides(t.shape))
        if (
            kind == "slice"
        ):  # read in place: an alias of the operand's memory from the first element
            src = self.materialize(
                self.ref_of(inst.operands[0]), operand_name(inst.operands[0]), order
            )
            a = inst.attrs
            k, step = a["axis"], a.get("step", 1)
            offset = a["lo"] * src.strides[k]
            strides = tuple(
                s * step if i == k else s for i, s in enumerate(src.strides)
            )  # a step: wider
            if offset == 0:  # starts where the operand does: its slot, fewer elements
                link = ("slice", (k, a["lo"], a["hi"]) + ((step,) if step != 1 else ()))
                return Mat(src.slot, tuple(t.shape), str(t.dtype), strides, src.chain + (link,))
            size = math.prod(self.slots[src.slot].shape)
            alias = self.new_slot((size - offset,), str(t.dtype), ALIAS, name)
            self.steps.append(AliasStep(src.slot, alias, offset, name, order))
            return Mat(
                alias,
                tuple(t.shape),
                str(t.dtype),
                strides,
                (("strided", (tuple(t.shape), strides)),),
            )
        if kind == "cumsum":  # a numpy/CuPy step (scan.py) on a buffer
            src = self.materialize(
                self.ref_of(inst.operands[0]), operand_name(inst.operands[0]), order
            )
            out = self.new_slot(t.shape, str(t.dtype), TEMP, name)
            self.steps.append(
                ScanStep(
                    view_of(src), inst.attrs["axis"], bool(inst.attrs["reverse"]), out, name, order
                )
            )
            return Mat(out, t.shape, str(t.dtype), c_strides(t.shape))
        if kind == "sliceScatter":  # zeros, then g written in place at every step-th entry
            src = self.materialize(
                self.ref_of(inst.operands[0]), operand_name(inst.operands[0]), order
            )
            out = self.new_slot(t.shape, str(t.dtype), TEMP, name)
            a = inst.attrs
            self.steps.append(
                SliceScatterStep(view_of(src), a["axis"], a["lo"], a["step"], out, name, order)
            )
            return Mat(out, t.shape, str(t.dtype), c_strides(t.shape))
        if kind in ("take", "scatterAdd"):  # a numpy/CuPy step (gather.py) on buffers
            src, ids = (
                self.materialize(self.ref_of(o), operand_name(o), order) for o in inst.operands
            )
            out = self.new_slot(t.shape, str(t.dtype), TEMP, name)
            size = inst.attrs["size"] if kind == "scatterAdd" else src.shape[inst.attrs["axis"]]
            self.steps.append(
                IndexStep(
                    kind, view_of(src), view_of(ids), inst.attrs["axis"], size, out, name, order
                )
            )
            return Mat(out, t.shape, str(t.dtype), c_strides(t.shape))
        if kind in ("attention", "attentionBackward"):  # issue 33: planning/attention.py
            return plan_attention(self, inst, order, name, t, TEMP)
        if (
            kind == "window"
        ):  # im2col + GEMM, pools: numpy/CuPy over buffers (execution/window_steps.py)
            ins = [self.materialize(self.ref_of(o), operand_name(o), order) for o in inst.operands]
            out = self.new_slot(t.shape, str(t.dtype), TEMP, name)
            self.steps.append(
                WindowStep(
                    inst.op,
                    window_ops.pack(inst.op, inst.attrs),
                    tuple(view_of(m) for m in ins),
                    out,
                    name,
                    order,
                )
            )
            return Mat(out, t.shape, str(t.dtype), c_strides(t.shape))
        if kind == "concat":
            parts = [p for o in inst.operands for p in self.spliced.get(id(o), [o])]
            if id(inst.result) in self.splice:  # its one reader copies these parts instead
                self.spliced[id(inst.result)] = parts
                return None
            parts = [self.materialize(self.ref_of(o), operand_name(o), order) for o in parts]
            out = self.new_slot(t.shape, str(t.dtype), TEMP, name)
            self.steps.append(
                ConcatStep(tuple(view_of(p) for p in parts), inst.attrs["axis"], out, name, order)
            )
            return Mat(out, t.shape, str(t.dtype), c_strides(t.shape))
        raise PlanError(f"@{self.name}: the code generator does not support {inst.op}")

    def elementwise(self, inst: Instruction) -> Fused:
        t = inst.result.type
        shape = t.shape
        refs = [self.ref_of(o) for o in inst.operands]
        xs = [self.operand_expr(r, shape) for r in refs]
        op = inst.op
        if op == "select":
            a, b, m = xs
            expr = Select(m, a, b)
        elif op == "dataTypeCast":
            expr = Cast(xs[0], str(inst.attrs["dtype"]))
        elif len(xs) == 1:
            expr = unary(op, xs[0])
        else:
            a, b = xs
            src = str(inst.operands[0].type.dtype)
            if src == "bool" and op in (
                "lessThan",
                "lessThanOrEqual",
                "greaterThan",
                "greaterThanOrEqual",
            ):
                a, b = Cast(a, "i32"), Cast(b, "i32")  # kernels order ints, not bools
            expr = binary(op, a, b)
        names = frozenset().union(*(r.names for r in refs if isinstance(r, Fused))) | {
            inst.result.name
        }
        nodes = 1 + sum(r.nodes for r in refs if isinstance(r, Fused))
        return Fused(expr, shape, str(t.dtype), names, nodes)

    def view(self, inst: Instruction, order: int):
        src = self.ref_of(inst.operands[0])
        t = inst.result.type
        if isinstance(src, Konst):
            return Konst(src.value, src.dtype, t.shape)
        fn, link = layout_view_map(inst, src.shape)
        if isinstance(src, Fused):
            try:
                expr = self.reindex(src.expr, fn)
                return Fused(expr, t.shape, src.dtype, src.names | {inst.result.name}, src.nodes)
            except NoView:
                src = self.materialize(src, operand_name(inst.operands[0]), order)
        st = fn(src.strides)
        if st is None:  # a shape cast of a non-contiguous view: copy it (a strided kernel)
            copy = Fused(self.leaf(src.slot, src.strides), src.shape, src.dtype, frozenset(), 1)
            src = self.materialize(copy, operand_name(inst.operands[0]), order)
            st = fn(src.strides)
            link = ("reshape", t.shape)
        return Mat(src.slot, t.shape, src.dtype, st, src.chain + (link,))

    def reduce(self, inst: Instruction, order: int) -> Mat:
        merged = self.merged_reduce(inst)
        if merged is not None:
            return merged
        src = self.ref_of(inst.operands[0])
        x_type = inst.operands[0].type
        body = self.operand_expr(src, x_type.shape)
        t = inst.result.type
        slot = self.new_slot(t.shape, str(t.dtype), TEMP, inst.result.name)
        names = (src.names if isinstance(src, Fused) else frozenset()) | {inst.result.name}
        node = ReduceNode(
            inst.result.name,
            body,
            tuple(x_type.shape),
            inst.attrs["combinator"],
            tuple(inst.attrs["axes"]),
            inst.attrs["init"],
            slot,
            order,
            names,
        )
        self.reductions.append(node)
        self.reduce_of[id(inst.result)] = node
        return Mat(slot, t.shape, str(t.dtype), c_strides(t.shape))

    def merged_reduce(self, inst: Instruction) -> Mat | None:
        """A reduction of another's result through the shape cast that keeps the reduced axes as
        1s, nothing else reading either (how the adjoint sums a bias gradient: along 3, then 2,
        then 0), as one reduction over all the axes, reading the input once: the CNN's bias
        gradient took 87 + 24 + 18 us as three kernels, 61 us as one (32 x 32 x 16 x 16)."""
        cast = self.producer.get(id(inst.operands[0]))
        if cast is None or cast.op != "shapeCast":
            return None
        inner = self.reduce_of.get(id(cast.operands[0]))
        op = inst.attrs["combinator"]
        # one reader each: the inner reduction is merged into this one only, at most once
        if (
            inner is None
            or inner.op != op
            or len(self.readers.get(id(cast.result), ())) != 1
            or len(self.readers.get(id(cast.operands[0]), ())) != 1
            or {id(cast.result), id(cast.operands[0])} & self.read_through
            or float(inner.init) != float(REDUCE_INIT[op])
        ):
            return None
        if tuple(cast.result.type.shape) != tuple(
            1 if i in inner.axes else d for i, d in enumerate(inner.shape)
        ):
            return None
        axes = tuple(sorted(set(inner.axes) | set(inst.attrs["axes"])))
        t = inst.result.type
        shape = tuple(d for i, d in enumerate(inner.shape) if i not in axes)
        self.reductions.remove(inner)
        slot = self.new_slot(shape, str(t.dtype), TEMP, inst.result.name)
        node = ReduceNode(
            inst.result.name,
            inner.body,
            inner.shape,
            op,
            axes,
            inst.attrs["init"],
            slot,
            inner.order,
            inner.names | {cast.result.name, inst.result.name},
        )
        self.reductions.append(node)
        self.reduce_of[id(inst.result)] = node
        out = tuple(t.shape)
        chain = () if out == shape else (("reshape", out),)  # the kept 1s: a view
        return Mat(slot, out, str(t.dtype), c_strides(out), chain)

    def results(self, order: int) -> list[View]:
        out, claimed = [], set()
        produced = (
            {e.slot for e in self.ew}
            | {r.slot for r in self.reductions}
            | {o for s in self.steps for o in step_outputs(s)}  # all: attention's dK and dV
        )
        for r in self.flat.results:
            ref = self.ref_of(r)
            name = operand_name(r)
            if not isinstance(ref, Mat):
                ref = self.materialize(ref, name, order, OUTPUT)
                claimed.add(ref.slot)
                out.append(view_of(ref))
                continue
            info = self.slots[ref.slot]
            plain = all(op == "reshape" for op, _ in ref.chain) and is_contiguous(
                ref.shape, ref.strides
            )
            if ref.slot in produced and ref.slot not in claimed and info.role == TEMP and plain:
                info.role = OUTPUT
                claimed.add(ref.slot)
                out.append(view_of(ref))
                continue
            slot = self.new_slot(ref.shape, ref.dtype, OUTPUT, name)
            self.steps.append(CopyStep(view_of(ref), slot, name, order))
            claimed.add(slot)
            out.append(View(slot, tuple(ref.shape), c_strides(tuple(ref.shape))))
        return out

    # -- grouping, kernels, schedule, arena
    def finish(self, params: list[int], results: list[View]) -> Plan:
        groups = self.group()
        nodes: list[Node] = []
        for members in groups:
            node = self.kernel_node(members)
            node.source = members
            nodes.append(node)
        for r in self.reductions:
            node = self.reduce_node(r)
            node.source = r
            nodes.append(node)
        for s in self.steps:
            nodes.append(Node(set(step_inputs(s)), list(step_outputs(s)), s.order, s))
        if self.rows:
            nodes = self.fuse_rows(nodes)
        if self.target == "cpu":
            nodes = fuse_epilogues(nodes, self.slots)
            nodes = write_in_reader_layout(nodes, self.slots)
            nodes = self.fuse_map_reductions(nodes)  # map_reduce.py: the fusion stage's choice
            nodes = write_concats_in_place(nodes, self.slots)  # concat_in_place.py
        order = schedule(nodes)
        steps = []
        n = 0
        for node in order:
            step = node.payload
            kernel = step.epilogue if isinstance(step, GemmStep) else step
            if isinstance(kernel, (KernelStep, RowStep, MapReduceStep)):
                kernel.spec = renamed_kernel(kernel.spec, f"k{n}_{kernel.spec.name}")
                n += 1
            steps.append(step)
        self.note_passes(steps)  # map_reduce.py: the report's shared passes, by kernel name
        slots = [Slot(i, s.shape, s.dtype, s.role, s.name) for i, s in enumerate(self.slots)]
        offsets, arena_bytes = arena(slots, steps)
        plan = Plan(
            self.name,
            slots,
            params,
            steps,
            results,
            self.flat.tuple_result,
            self.constants,
            offsets,
            arena_bytes,
        )
        plan.fusion = self.fusion  # why these kernels: printed by the plan and the compile report
        return plan
