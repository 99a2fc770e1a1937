"""IR Function -> kernel plan: which values are fused into which kernels.

    plan = plan_function(module["f"], module)
    print(plan)        # kernels (with the IR values each computes), BLAS calls, buffers

The rules, in the order they apply:
- Elementwise ops (any arity, casts, compares, select), scalar literals and layout ops on
  unmaterialized values become one scalar expression per kernel output; implicit and explicit
  broadcasts, transposes and shape casts become strided reads (`views.py`), never copies.
- Which values are materialized (written to a buffer) is not decided here: the fusion stage
  (egraph/fusion.py) loads the function into an e-graph where every elementwise value is also
  a `Map` of scalar ops and every read of it may recompute it (rules/fusion.egg), and
  extraction (extract/fusion_cost.py) picks the materialized set by a kernel cost model:
  results, BLAS, concatenate and slice operands and reductions are forced; a value kept in a buffer
  costs its kernel once, a value inlined costs its work in every kernel that reads it.
  Everything not chosen is recomputed where it is read. `plan.fusion` says what was chosen.
- Materialized values of the same iteration space form one multi-output kernel when that does
  not create a cycle and the kernel stays under MAX_KERNEL_NODES expression nodes; a value
  read element-for-element by a sibling output is computed once.
- A reduction fuses its producer into its body; `dot` is a BLAS call with transposed operands
  passed as views; `concatenate` and copies of views go through numpy/CuPy; a `slice` is read
  in place (an alias of its operand's memory from its first element, plan.AliasStep).
- A map and the reductions over trailing axes it reads become one row kernel (`rowfusion.py`:
  softmax, log-softmax, layer norm read their rows from memory once): on the CPU for any row
  length, on the GPU (one thread per row, `llvm_ptx._rows_kernel`) for rows of at most
  GPU_ROW_COLS elements.
- Steps are ordered topologically, kernels before BLAS calls, and temporaries are placed in
  one arena by liveness (`schedule.py`).

Files: ir/inline.py (apply/tuples), fusion (this: values -> kernels), rowfusion, schedule.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..ir.module import Const as IRConst
from ..ir.module import Function, Instruction, Module, Value
from ..ir import window_ops
from ..ir.ops import (BINARY, CAST, COMPARE, DOT, LITERAL, LOGIC, OPS, REDUCE, SELECT, TUPLE,
                      UNARY, WINDOW, transpose_perm)
from ..ir.inline import Flat, flatten
from .kernel import (Cast, Const, Expr, KernelInput, KernelSpec, Load, ReduceSpec, Select, binary,
                     c_strides, unary, walk)
from .epilogue import fuse_epilogues
from .plan import (ALIAS, CONST, OUTPUT, PARAM, TEMP, AliasStep, BlasStep, ConcatStep, CopyStep, GemmStep, KernelStep,
                   Plan, PlanError, RowStep, Slot, View, WindowStep, step_inputs, step_outputs)
from .rowfusion import RowFusion, short_op
from .rowwise import loads, rebuild
from .schedule import Node, arena, schedule
from .views import (NoView, broadcast_strides, is_contiguous, pad_strides, reshape_strides,
                    squeeze_strides, transpose_strides)

EW_KINDS = (UNARY, BINARY, COMPARE, LOGIC, SELECT, CAST)
VIEW_OPS = ("transpose", "shapeCast", "padShape", "squeezeShape", "broadcast")
MAX_EXPR_NODES = 160   # larger fused expressions are split (LLVM compile time grows quickly)
# A multi-output kernel holds at most this many expression nodes: LLVM's time grows faster than
# linearly with a function's size (a 3,000-op chain in one kernel: 48 s; in 300-op kernels: linear).
MAX_KERNEL_NODES = 2 * MAX_EXPR_NODES


# ------------------------------------------------------------------ value references

@dataclass(frozen=True)
class _Mat:
    """A value held in a buffer (slot), seen through a view."""
    slot: int
    shape: tuple
    dtype: str
    strides: tuple
    chain: tuple = ()


@dataclass(frozen=True)
class _Fused:
    """A value computed in registers: an expression over leaves (global Load ids)."""
    expr: Expr
    shape: tuple
    dtype: str
    names: frozenset
    nodes: int


@dataclass(frozen=True)
class _Konst:
    value: object
    dtype: str
    shape: tuple




@dataclass
class _EwOut:
    """A materialized elementwise value: a kernel output."""
    name: str
    expr: Expr
    shape: tuple
    dtype: str
    slot: int
    order: int
    names: frozenset
    group: int = -1
    reads: set = None        # slots its expression loads (grouping)


@dataclass
class _ReduceNode:
    name: str
    body: Expr
    shape: tuple
    op: str
    axes: tuple
    init: object
    slot: int
    order: int
    names: frozenset


@dataclass
class _SlotInfo:
    shape: tuple
    dtype: str
    role: str
    name: str = ""


# ------------------------------------------------------------------ the planner

# Row kernels on the GPU run one thread per row (no barriers): only for short rows, whose warp
# reads share a few cache lines; longer rows stay a reduction kernel and a map kernel.
GPU_ROW_COLS = 64


def rows_for(target: str) -> bool | int:
    """The `rows` argument of plan_function for a target: any row length on the CPU, short
    rows on the GPU."""
    return True if target == "cpu" else GPU_ROW_COLS


def plan_function(fn: Function, module: Module | None = None, rows: bool | int = True,
                  target: str | None = None) -> Plan:
    """The kernel plan of IR function `fn` (of `module`, for applies and declared adjoints).
    rows: fuse reductions over trailing axes with the map that reads them into row kernels:
    True for rows of any length, an int for rows of at most that many elements (the gpu
    target: `rows_for`), False for none. target: the machine whose costs decide fusion
    (extract/machine.py)."""
    target = target or "cpu"
    return _Planner(flatten(fn, module), fn.name, rows, target).build()


class _Planner(RowFusion):
    def __init__(self, flat: Flat, name: str, rows: bool | int = True, target: str = "cpu"):
        self.flat, self.name, self.target = flat, name, target
        self.rows = rows is True or (rows is not False and int(rows) > 0)
        self.row_limit = None if rows is True else int(rows)   # longest row a row kernel takes
        self.fusion = None             # the fusion stage's report (egraph/fusion.py)
        self.same_as: dict = {}        # id(value) -> an earlier value it equals (the e-graph's)
        self.slots: list[_SlotInfo] = []
        self.leaves: list[tuple[int, tuple]] = []
        self.leaf_ids: dict[tuple[int, tuple], int] = {}
        self.ew: list[_EwOut] = []
        self.ew_by_slot: dict[int, _EwOut] = {}
        self.reductions: list[_ReduceNode] = []
        self.steps: list = []          # BlasStep / ConcatStep / CopyStep
        self.constants: dict[int, np.ndarray] = {}
        self.refs: dict[int, object] = {}
        self.op_of: dict[str, str] = {}     # IR value name -> op (kernel names)
        self.pos_of: dict[str, int] = {}

    # -- slots and leaves
    def new_slot(self, shape, dtype: str, role: str, name: str = "") -> int:
        self.slots.append(_SlotInfo(tuple(shape), dtype, role, name))
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
        (egraph/fusion.py, rules/fusion.egg, extract/fusion_cost.py)."""
        from ..egraph.fusion import decide_fusion
        # the cost model counts trailing reductions into row kernels only where all may be
        decision = decide_fusion(self.flat, self.target, rows=self.rows and self.row_limit is None)
        self.fusion, self.same_as = decision.report, decision.same_as
        return decision.materialize

    # -- expressions
    def operand_expr(self, ref, shape) -> Expr:
        """`ref` read at every element of `shape` (numpy broadcasting)."""
        if isinstance(ref, _Konst):
            return Const(ref.value, ref.dtype)
        if isinstance(ref, _Mat):
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

    def materialize(self, ref, name: str, order: int, role: str = TEMP) -> _Mat:
        if isinstance(ref, _Mat):
            return ref
        if isinstance(ref, _Konst):
            expr, names = Const(ref.value, ref.dtype), frozenset()
        else:
            expr, names = ref.expr, ref.names
        slot = self.new_slot(ref.shape, ref.dtype, role, name)
        out = _EwOut(name, expr, tuple(ref.shape), ref.dtype, slot, order, names | {name})
        self.ew.append(out)
        self.ew_by_slot[slot] = out
        return _Mat(slot, tuple(ref.shape), ref.dtype, c_strides(tuple(ref.shape)))

    # -- the forward pass
    def build(self) -> Plan:
        flat = self.flat
        materialize = self.decide()
        params = []
        for p in flat.params:
            s = self.new_slot(p.type.shape, str(p.type.dtype), PARAM, p.name)
            params.append(s)
            self.refs[id(p)] = _Mat(s, p.type.shape, str(p.type.dtype), c_strides(p.type.shape))
        for order, inst in enumerate(flat.body):
            self.op_of[inst.result.name], self.pos_of[inst.result.name] = inst.op, order
            same = self.same_as.get(id(inst.result))
            if same is not None:       # equal to an earlier value (one e-class): computed once
                self.refs[id(inst.result)] = self.refs[id(same)]
                continue
            ref = self.instruction(inst, order)
            if id(inst.result) in materialize and not isinstance(ref, _Mat):
                ref = self.materialize(ref, inst.result.name, order)
            elif isinstance(ref, _Fused) and ref.nodes > MAX_EXPR_NODES:
                ref = self.materialize(ref, inst.result.name, order)
            self.refs[id(inst.result)] = ref
        results = self.results(len(flat.body))
        self.results_views = results
        return self.finish(params, results)

    def ref_of(self, o):
        if isinstance(o, IRConst):
            return _Konst(o.value, str(o.type.dtype), ())
        return self.refs[id(o)]

    def instruction(self, inst: Instruction, order: int):
        kind = _kind(inst)
        t = inst.result.type
        name = inst.result.name
        if kind == "ew":
            return self.elementwise(inst)
        if kind == "const":
            return _Konst(np.asarray(inst.attrs["value"]).item(), str(t.dtype), t.shape)
        if kind == "literal":
            slot = self.new_slot(t.shape, str(t.dtype), CONST, name)
            self.constants[slot] = np.ascontiguousarray(
                np.asarray(inst.attrs["value"], dtype=_np_dtype(t.dtype)).reshape(t.shape))
            return _Mat(slot, t.shape, str(t.dtype), c_strides(t.shape))
        if kind == "view":
            return self.view(inst, order)
        if kind == "reduce":
            return self.reduce(inst, order)
        if kind == "dot":
            a, b = (self.materialize(self.ref_of(o), _name(o), order) for o in inst.operands)
            out = self.new_slot(t.shape, str(t.dtype), TEMP, name)
            self.steps.append(BlasStep(_view(a), _view(b), out, name, order))
            return _Mat(out, t.shape, str(t.dtype), c_strides(t.shape))
        if kind == "slice":   # read in place: an alias of the operand's memory from the first element
            src = self.materialize(self.ref_of(inst.operands[0]), _name(inst.operands[0]), order)
            a = inst.attrs
            offset = a["lo"] * src.strides[a["axis"]]
            if offset == 0:       # starts where the operand does: its slot, fewer elements
                link = ("slice", (a["axis"], a["lo"], a["hi"]))
                return _Mat(src.slot, tuple(t.shape), str(t.dtype), tuple(src.strides), src.chain + (link,))
            size = math.prod(self.slots[src.slot].shape)
            alias = self.new_slot((size - offset,), str(t.dtype), ALIAS, name)
            self.steps.append(AliasStep(src.slot, alias, offset, name, order))
            strides = tuple(src.strides)
            return _Mat(alias, tuple(t.shape), str(t.dtype), strides, (("strided", (tuple(t.shape), strides)),))
        if kind == "window":   # im2col + GEMM, pools: numpy/CuPy over buffers (codegen/window.py)
            ins = [self.materialize(self.ref_of(o), _name(o), order) for o in inst.operands]
            out = self.new_slot(t.shape, str(t.dtype), TEMP, name)
            self.steps.append(WindowStep(inst.op, window_ops.pack(inst.op, inst.attrs),
                                         tuple(_view(m) for m in ins), out, name, order))
            return _Mat(out, t.shape, str(t.dtype), c_strides(t.shape))
        if kind == "concat":
            parts = [self.materialize(self.ref_of(o), _name(o), order) for o in inst.operands]
            out = self.new_slot(t.shape, str(t.dtype), TEMP, name)
            self.steps.append(ConcatStep(tuple(_view(p) for p in parts), inst.attrs["axis"], out, name, order))
            return _Mat(out, t.shape, str(t.dtype), c_strides(t.shape))
        raise PlanError(f"@{self.name}: the code generator does not support {inst.op}")

    def elementwise(self, inst: Instruction) -> _Fused:
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
            if src == "bool" and op in ("lessThan", "lessThanOrEqual", "greaterThan", "greaterThanOrEqual"):
                a, b = Cast(a, "i32"), Cast(b, "i32")   # kernels order ints, not bools
            expr = binary(op, a, b)
        names = frozenset().union(*(r.names for r in refs if isinstance(r, _Fused))) | {inst.result.name}
        nodes = 1 + sum(r.nodes for r in refs if isinstance(r, _Fused))
        return _Fused(expr, shape, str(t.dtype), names, nodes)

    def view(self, inst: Instruction, order: int):
        src = self.ref_of(inst.operands[0])
        t = inst.result.type
        if isinstance(src, _Konst):
            return _Konst(src.value, src.dtype, t.shape)
        fn, link = _view_map(inst, src.shape)
        if isinstance(src, _Fused):
            try:
                expr = self.reindex(src.expr, fn)
                return _Fused(expr, t.shape, src.dtype, src.names | {inst.result.name}, src.nodes)
            except NoView:
                src = self.materialize(src, _name(inst.operands[0]), order)
        st = fn(src.strides)
        if st is None:   # a shape cast of a non-contiguous view: copy it (a strided kernel)
            copy = _Fused(self.leaf(src.slot, src.strides), src.shape, src.dtype, frozenset(), 1)
            src = self.materialize(copy, _name(inst.operands[0]), order)
            st = fn(src.strides)
            link = ("reshape", t.shape)
        return _Mat(src.slot, t.shape, src.dtype, st, src.chain + (link,))

    def reduce(self, inst: Instruction, order: int) -> _Mat:
        src = self.ref_of(inst.operands[0])
        x_type = inst.operands[0].type
        body = self.operand_expr(src, x_type.shape)
        t = inst.result.type
        slot = self.new_slot(t.shape, str(t.dtype), TEMP, inst.result.name)
        names = (src.names if isinstance(src, _Fused) else frozenset()) | {inst.result.name}
        self.reductions.append(_ReduceNode(inst.result.name, body, tuple(x_type.shape),
                                           inst.attrs["combinator"], tuple(inst.attrs["axes"]),
                                           inst.attrs["init"], slot, order, names))
        return _Mat(slot, t.shape, str(t.dtype), c_strides(t.shape))

    def results(self, order: int) -> list[View]:
        out, claimed = [], set()
        produced = {e.slot for e in self.ew} | {r.slot for r in self.reductions} | \
            {step_outputs(s)[0] for s in self.steps}
        for r in self.flat.results:
            ref = self.ref_of(r)
            name = _name(r)
            if not isinstance(ref, _Mat):
                ref = self.materialize(ref, name, order, OUTPUT)
                claimed.add(ref.slot)
                out.append(_view(ref))
                continue
            info = self.slots[ref.slot]
            plain = all(op == "reshape" for op, _ in ref.chain) and is_contiguous(ref.shape, ref.strides)
            if ref.slot in produced and ref.slot not in claimed and info.role == TEMP and plain:
                info.role = OUTPUT
                claimed.add(ref.slot)
                out.append(_view(ref))
                continue
            slot = self.new_slot(ref.shape, ref.dtype, OUTPUT, name)
            self.steps.append(CopyStep(_view(ref), slot, name, order))
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
        order = schedule(nodes)
        steps = []
        n = 0
        for node in order:
            step = node.payload
            kernel = step.epilogue if isinstance(step, GemmStep) else step
            if isinstance(kernel, (KernelStep, RowStep)):
                kernel.spec = _renamed(kernel.spec, f"k{n}_{kernel.spec.name}")
                n += 1
            steps.append(step)
        slots = [Slot(i, s.shape, s.dtype, s.role, s.name) for i, s in enumerate(self.slots)]
        offsets, arena_bytes = arena(slots, steps)
        plan = Plan(self.name, slots, params, steps, results, self.flat.tuple_result,
                    self.constants, offsets, arena_bytes)
        plan.fusion = self.fusion      # why these kernels: printed by the plan and the compile report
        return plan

    GROUP_CANDIDATES = 4   # recent kernels of the same space a value may join (plan time)

    def group(self) -> list[list[_EwOut]]:
        """Materialized elementwise values -> multi-output kernels (same iteration space,
        no cycle through other steps)."""
        groups: list[list[_EwOut]] = []
        group_in: list[set[int]] = []          # slots the members of a group read
        by_key: dict[tuple, list[int]] = {}
        producer_steps = {}
        for s in self.steps:
            for o in step_outputs(s):
                producer_steps[o] = set(step_inputs(s))
        for r in self.reductions:
            producer_steps[r.slot] = {self.leaves[i.index][0] for i in loads(r.body)}
        size: dict[int, int] = {}               # slot -> nodes of its expression
        for e in self.ew:
            nodes = walk([e.expr])
            size[e.slot] = len(nodes)
            e.reads = {self.leaves[ld.index][0] for ld in nodes if isinstance(ld, Load)}
        group_nodes: list[int] = []
        for e in self.ew:
            key = tuple(d for d in e.shape if d != 1)
            placed = False
            for gi in reversed(by_key.get(key, [])[-self.GROUP_CANDIDATES:]):
                if group_nodes[gi] + size[e.slot] > MAX_KERNEL_NODES and groups[gi]:
                    continue
                if self.can_join(e, gi, groups, group_in, producer_steps):
                    groups[gi].append(e)
                    group_in[gi] |= e.reads
                    group_nodes[gi] += size[e.slot]
                    e.group = gi
                    placed = True
                    break
            if not placed:
                e.group = len(groups)
                groups.append([e])
                group_in.append(set(e.reads))
                group_nodes.append(size[e.slot])
                by_key.setdefault(key, []).append(e.group)
        return groups

    def can_join(self, e: _EwOut, gi: int, groups, group_in, producer_steps) -> bool:
        members = groups[gi]
        g_slots = {m.slot for m in members}
        shape = members[0].shape
        expr = e.expr if e.shape == shape else self._reshaped(e.expr, e.shape, shape)
        if expr is None:
            return False
        external = set()
        for ld in loads(expr):
            slot, st = self.leaves[ld.index]
            if slot in g_slots:
                if not is_contiguous(shape, st):
                    return False      # read at another element: needs the whole output first
                continue
            external.add(slot)
        # does an external input depend on the group (through other kernels and steps)?
        stack, seen = list(external), set()
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            if s in g_slots:
                return False
            ew = self.ew_by_slot.get(s)
            if ew is not None:
                stack.extend(group_in[ew.group] if ew.group >= 0 else ew.reads)
            else:
                stack.extend(producer_steps.get(s, ()))
        return True

    def _reshaped(self, expr: Expr, shape, to_shape):
        try:
            return self.reindex(expr, lambda st: reshape_strides(shape, st, to_shape))
        except NoView:
            return None

    def group_exprs(self, members: list[_EwOut]) -> list[Expr]:
        """The members' expressions over the first member's shape (global Load ids); a sibling
        output read element-for-element is computed once, in registers."""
        shape = members[0].shape
        by_slot = {}
        for m in members:
            by_slot[m.slot] = m.expr if m.shape == shape else self._reshaped(m.expr, m.shape, shape)
        resolved: dict[int, Expr] = {}
        for m in members:   # members are in program order: producers first
            resolved[m.slot] = self._substitute(by_slot[m.slot], resolved, shape)
        return [resolved[m.slot] for m in members]

    def kernel_node(self, members: list[_EwOut]) -> Node:
        shape = members[0].shape
        exprs = self.group_exprs(members)
        inputs, local = self._inputs(exprs, shape)
        outs = [self._localize(e, local) for e in exprs]
        names = tuple(m.name for m in members) + tuple(sorted(
            set().union(*(m.names for m in members)) - {m.name for m in members}, key=self._pos))
        spec = KernelSpec(self._kernel_name(sorted(names, key=self._pos)), shape, inputs[1], outs)
        step = KernelStep(spec, tuple(inputs[0]), tuple(m.slot for m in members), names,
                          min(m.order for m in members))
        return Node(set(inputs[0]), [m.slot for m in members], step.order, step)

    def reduce_node(self, r: _ReduceNode) -> Node:
        inputs, local = self._inputs([r.body], r.shape)
        fused = tuple(sorted(r.names - {r.name}, key=self._pos))
        spec = ReduceSpec(f"{short_op(r.op)}_" + self._kernel_name(fused, 2) if fused else f"reduce_{short_op(r.op)}",
                          r.shape, inputs[1], self._localize(r.body, local), r.op, r.axes, r.init)
        names = (r.name,) + fused
        step = KernelStep(spec, tuple(inputs[0]), (r.slot,), names, r.order)
        return Node(set(inputs[0]), [r.slot], r.order, step)

    def _pos(self, name: str) -> int:
        return self.pos_of.get(name, 1 << 30)

    def _kernel_name(self, names, limit: int = 3) -> str:
        """'add_relu_greaterThan': the distinct ops computed, in program order (views skipped)."""
        ops = []
        for n in names:
            op = self.op_of.get(n, "copy")
            if op not in ops and op not in VIEW_OPS and op != "literal":
                ops.append(op)
        return "_".join(ops[:limit]) or "copy"

    def _substitute(self, expr: Expr, resolved: dict[int, Expr], shape) -> Expr:
        repl = {}
        for ld in loads(expr):
            slot, st = self.leaves[ld.index]
            if slot in resolved and is_contiguous(shape, st):
                repl[ld] = resolved[slot]
        return rebuild(expr, repl) if repl else expr

    def _inputs(self, exprs, shape):
        """(slots, KernelInputs) for the leaves of `exprs`, and global -> local Load ids."""
        slots, inputs, local = [], [], {}
        for ld in [e for e in walk(exprs) if isinstance(e, Load)]:
            slot, st = self.leaves[ld.index]
            info = self.slots[slot]
            contiguous = math.prod(info.shape) == math.prod(shape) and is_contiguous(shape, st)
            local[ld.index] = len(inputs)
            slots.append(slot)
            inputs.append(KernelInput(info.dtype, None if contiguous else st))
        return (slots, inputs), local

    def _localize(self, expr: Expr, local: dict[int, int]) -> Expr:
        return rebuild(expr, {ld: Load(local[ld.index]) for ld in loads(expr)})


# ------------------------------------------------------------------ helpers

def _kind(inst: Instruction) -> str:
    spec = OPS[inst.op]
    if spec.kind in EW_KINDS:
        return "ew"
    if inst.op in VIEW_OPS:
        return "view"
    if spec.kind == REDUCE:
        return "reduce"
    if spec.kind == DOT:
        return "dot"
    if inst.op == "concatenate":
        return "concat"
    if spec.kind == WINDOW:
        return "window"
    if spec.kind == LITERAL:
        return "const" if np.ndim(inst.attrs["value"]) == 0 else "literal"
    if spec.kind == TUPLE:
        return "tuple"
    return inst.op


def _np_dtype(d):
    return {"f32": np.float32, "f64": np.float64, "i32": np.int32, "bool": np.bool_}[str(d)]


def _name(o) -> str:
    return o.name if isinstance(o, Value) else "const"


def _view(m: _Mat) -> View:
    return View(m.slot, tuple(m.shape), tuple(m.strides), tuple(m.chain))


def _view_map(inst: Instruction, shape):
    """(strides -> strides or None, numpy chain link) for a layout op on a view of `shape`."""
    t = inst.result.type
    op, at = inst.op, inst.attrs
    if op == "transpose":
        perm = transpose_perm(len(shape), at)
        return (lambda st: transpose_strides(st, perm)), ("transpose", tuple(perm))
    if op == "broadcast":
        return (lambda st: broadcast_strides(st, shape, t.shape)), ("broadcast", tuple(t.shape))
    if op == "padShape":
        return (lambda st: pad_strides(st, at["at"])), ("reshape", tuple(t.shape))
    if op == "squeezeShape":
        return (lambda st: squeeze_strides(st, at["at"])), ("reshape", tuple(t.shape))
    return (lambda st: reshape_strides(shape, st, t.shape)), ("reshape", tuple(t.shape))








def _renamed(spec, name: str):
    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in name)[:48]
    return dataclasses.replace(spec, name=safe)
