"""The fusion stage: which values of an optimized IR function are materialized (written to a
buffer) and which are recomputed inside the kernels that read them, decided by extraction.

    decision = decide_fusion(flat, target="cpu")     # flat: ir.inline.flatten(fn, module)
    decision.materialize                              # ids of the IR values to keep in buffers
    print(decision.report)                            # e-graph size, choices, cost before/after

The function is loaded into a small e-graph of its own (rules/schema.egg + rules/fusion.egg,
one term per IR value, implicit broadcasts explicit), the `fusion` ruleset is saturated under a
budget (it adds a `Map` of scalar ops beside every elementwise term and makes every read of a
map or a view its scalar expression), and extract/fusion_cost.py picks the materialized set
with a kernel cost model. Values that must be in buffers are forced: function results, the
operands of BLAS calls, concatenations and slices (through views), reduction outputs. When saturation
stops on a budget, nothing is left to chance: every elementwise value is materialized.

The budget (`FusionBudget`) is work, not time, so that the program does not depend on the
machine's load and may be cached: saturation stops at `iterations` rounds or `nodes` e-nodes,
extraction at `work` expansion steps (extract/fusion_cost.greedy_fusion; past them greedy keeps
what it decided and inlines the rest, and the report's note says so). `seconds` is only a
last-resort cap on the whole stage (saturation and extraction): a decision it cuts says so in
its note and is not cached (cache.note_time_cut), since another moment would decide otherwise.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..codegen import FusionReport  # the plan's record of this decision (plain data)
from ..config import settings
from ..errors import DlvmError
from ..ir.inline import Flat
from ..ir.module import Const as IRConst
from ..ir.module import Value
from ..ir.ops import CAST, DOT, ELEMENTWISE_KINDS, LITERAL, OPS, REDUCE, transpose_perm
from ..ir.types import TensorType
from ..ir.window_ops import WINDOW_OPS
from .lets import Let, LetTable, inline, let_name
from .ruleset_schedule import Budget

FUSIBLE_KINDS = ELEMENTWISE_KINDS + (CAST,)
VIEW_OPS = ("transpose", "shapeCast", "padShape", "squeezeShape", "broadcast")
# numpy/CuPy steps: they read and write buffers (convolutions and pools too: im2col + GEMM)
COPY_OPS = ("concatenate", "slice", "take", "scatterAdd", "sliceScatter", "cumsum") + WINDOW_OPS
COPY_OPS += ("attention", "attentionBackward")  # issue 33: the fused attention kernels read buffers


@dataclass(frozen=True)
class FusionBudget(Budget):
    """The fusion stage's budget: saturation's iterations and nodes, extraction's `work`
    (expansion steps of greedy_fusion's cost evaluations, about 1 us each on this project's
    machines when quiet), and a last-resort wall-clock cap `seconds`."""

    iterations: int = 12
    nodes: int = 200_000
    # the cap: far above what the work budget takes (a 5,000-op program: a few seconds)
    seconds: float = 60.0
    # 2M steps: ~1.5-3 s of extraction when quiet; the benchmark models take 1k-13k, a
    # 30-layer tanh-chain gradient 0.2M, 128 and 256 layers 0.46M (none of them is cut)
    work: int = 2_000_000


DEFAULT_BUDGET = FusionBudget()


def fusion_budget(budget) -> FusionBudget:
    """A FusionBudget from a FusionBudget, a plain Budget (its iterations, nodes and seconds,
    the default work), a dict of FusionBudget's fields or None (DEFAULT_BUDGET)."""
    if isinstance(budget, Budget) and not isinstance(budget, FusionBudget):
        return FusionBudget(budget.iterations, budget.nodes, budget.seconds)
    return FusionBudget.of(budget)


@dataclass
class FusionDecision:
    materialize: set  # id() of the IR values to keep in buffers
    report: FusionReport
    same_as: dict = field(default_factory=dict)  # id(value) -> an earlier Value it equals
    # reductions priced cheaper in one pass with the maps of their space (planning/map_reduce.py
    # fuses them where it can): IR value name -> model seconds saved
    shared_pass: dict = field(default_factory=dict)
    # reductions over trailing axes priced cheaper in one row pass with the other reductions
    # and maps of their rows (planning/rowfusion.py then recomputes the per-row maps between
    # them that other kernels read: a layer norm's two moments): IR value name -> seconds saved
    row_pass: dict = field(default_factory=dict)


# ------------------------------------------------------------------ the loader


@dataclass
class _Loaded:
    terms: list = field(default_factory=list)  # Term Lets (bound as marker rows)
    loads: list = field(default_factory=list)  # Scalar Lets of result loads (globals)
    names: list = field(default_factory=list)  # let names, in order
    kind: dict = field(default_factory=dict)  # let -> param, const, ew, view, ...
    type: dict = field(default_factory=dict)  # let -> TensorType
    of_value: dict = field(default_factory=dict)  # id(IR Value) -> Let
    result_loads: dict = field(default_factory=dict)  # view result let -> let of (Load it)
    reduce_input: dict = field(default_factory=dict)  # reduce let -> (input type, axes)
    depth: dict = field(default_factory=dict)  # let -> kernel boundaries above it
    reduce_depth: dict = field(default_factory=dict)  # reduce let -> the depth of its input


class _Loader:
    def __init__(self):
        self.out = _Loaded()
        self.table = LetTable("fu")  # interned: one let per distinct term
        self.out.terms = self.table.lets

    def let(self, ctor: str, args: tuple, t: TensorType, kind: str) -> Let:
        known = len(self.table.lets)
        let = self.table.let(ctor, args, t)
        if len(self.table.lets) > known:
            self.out.names.append(let.name)
            self.out.kind[let.name], self.out.type[let.name] = kind, t
        return let

    def const(self, value, dtype) -> Let:
        return self.let("Const", (float(value), str(dtype)), TensorType((), dtype), "const")

    def operand(self, o, shape) -> Let:
        if isinstance(o, IRConst):
            term, t = self.const(o.value, o.type.dtype), TensorType((), o.type.dtype)
        else:
            term, t = self.out.of_value[id(o)], o.type
        shape = tuple(int(d) for d in shape)
        if tuple(t.shape) != shape:
            term = self.let("Broadcast", (term, shape), t.with_shape(shape), "view")
        return term


def merged_axes(flat: Flat) -> dict[int, tuple]:
    """id(result) of a reduction the planner merges with the reductions after it (through
    shape casts that keep the reduced axes as 1s, one reader each, one op: how the adjoint sums
    a bias gradient, along 3, then 2, then 0; planner.merged_reduce) -> all the axes the merged
    reduction folds. Its input is read once, by one reduction over all of them."""
    from ..codegen.planning.plan_queries import readers

    users = readers(flat)
    producer = {id(i.result): i for i in flat.body}
    first: dict[int, tuple] = {}  # id(reduce result) -> (id of its chain's first, its axes)
    out: dict[int, tuple] = {}
    for inst in flat.body:
        if OPS[inst.op].kind != REDUCE:
            continue
        axes = tuple(sorted(inst.attrs["axes"]))
        cast = producer.get(id(inst.operands[0]))
        inner = producer.get(id(cast.operands[0])) if cast and cast.op == "shapeCast" else None
        if (
            inner is not None
            and id(inner.result) in first
            and inner.attrs["combinator"] == inst.attrs["combinator"]
            and len(users.get(id(cast.result), ())) == 1
            and len(users.get(id(inner.result), ())) == 1
        ):
            head, head_axes = first[id(inner.result)]
            merged = tuple(sorted(set(head_axes) | set(axes)))
            first[id(inst.result)] = (head, merged)
            out[head] = merged
        else:
            first[id(inst.result)] = (id(inst.result), axes)
    return out


def load_fusion(flat: Flat) -> _Loaded:
    """The fusion e-graph's terms of `flat`: one let per distinct term."""
    ld = _Loader()
    out = ld.out
    merged = merged_axes(flat)
    for p in flat.params:
        out.of_value[id(p)] = ld.let("Var", (p.name,), p.type, "param")
    for inst in flat.body:
        let = out.of_value[id(inst.result)] = _load_instruction(ld, inst)
        if out.kind[let.name] == "reduce":
            axes = merged.get(id(inst.result), tuple(sorted(inst.attrs["axes"])))
            out.reduce_input[let.name] = (inst.operands[0].type, axes)
    for r in flat.results:
        if isinstance(r, Value) and out.kind[out.of_value[id(r)].name] == "view":
            v = out.of_value[id(r)]
            # a Load is a Scalar, not a Term: an egglog global (one per returned view)
            load = Let(let_name("fuload", len(out.loads)), "Load", (v,))
            out.loads.append(load)
            out.result_loads[v.name] = load.name
    return out


def _load_instruction(ld: _Loader, inst) -> Let:
    spec, t, a = OPS[inst.op], inst.result.type, inst.attrs
    if spec.kind == LITERAL:
        if np.ndim(a["value"]) == 0:
            return ld.let("Const", (float(np.asarray(a["value"]).item()), str(t.dtype)), t, "const")
        return ld.let("Lit", (inst.result.name,), t, "literal")
    if spec.kind in FUSIBLE_KINDS:
        args = tuple(ld.operand(o, t.shape) for o in inst.operands)
        if inst.op == "dataTypeCast":
            args += (str(a["dtype"]),)
        return ld.let(spec.egg, args, t, "ew")
    if inst.op in VIEW_OPS:
        x = ld.operand(inst.operands[0], inst.operands[0].type.shape)
        if inst.op == "transpose":
            return ld.let(
                "Transpose", (x, tuple(transpose_perm(inst.operands[0].type.rank, a))), t, "view"
            )
        return ld.let(
            "Broadcast" if inst.op == "broadcast" else "ShapeCast", (x, t.shape), t, "view"
        )
    if spec.kind == REDUCE:
        x = ld.operand(inst.operands[0], inst.operands[0].type.shape)
        axes = tuple(int(ax) for ax in sorted(a["axes"]))
        head = (a["combinator"], float(a["init"]))
        if len(axes) == 1:
            return ld.let("Reduce", (x, *head, axes[0]), t, "reduce")
        return ld.let("ReduceMap", (inline("Load", (x,)), *head, axes), t, "reduce")
    if spec.kind == DOT:
        return ld.let(spec.egg, tuple(ld.operand(o, o.type.shape) for o in inst.operands), t, "dot")
    if inst.op in COPY_OPS:  # opaque here: its operands are buffers
        return ld.let("Var", (inst.op + " %" + inst.result.name,), t, "concat")
    raise DlvmError(f"the fusion stage has no case for op {inst.op}")


# ------------------------------------------------------------------ the e-graph


def fusion_graph(loaded: _Loaded, budget: Budget | None = None) -> tuple[dict, dict]:
    """(serialized e-graph JSON with every let and result load as a root, saturation facts).
    The program lives between push and pop in this thread's fusion session (the schema and
    fusion.egg, egraph/optimize.py's FUSION_RULE_FILES): a push copies no other stage's rules."""
    from .fusion_ahead import compile_pending
    from .optimize import FUSION_RULE_FILES, scratch_session
    from .ruleset_schedule import Schedule
    from .saturate import saturate

    budget = fusion_budget(budget)
    with scratch_session(rulesets=("fusion",), shipped=FUSION_RULE_FILES) as s:
        t0 = time.perf_counter()
        compile_pending(s)  # the rules of the programs planned next too (fusion_ahead.py)
        s.add_lets(loaded.terms, "<fusion program>", facts=False)  # no analysis here
        if loaded.loads:
            s.add_globals(loaded.loads, "<fusion program>")
        t1 = time.perf_counter()
        # the one saturation driver; the fusion stage runs no analysis
        sat = saturate(s, Schedule(("fusion",)), budget, analysis=None)
        t2 = time.perf_counter()
        roots = loaded.names + list(loaded.result_loads.values())
        data = s.serialize(roots).data
        t3 = time.perf_counter()
    if len(data.get("root_eclasses", ())) != len(roots):
        raise DlvmError("fusion e-graph: serialized roots do not match the program's values")
    facts = {
        "stop_reason": sat.stop_reason,
        "iterations": sat.iterations,
        "nodes": sat.nodes,
        "roots": roots,
        "seconds": {"load": t1 - t0, "saturate": t2 - t1, "serialize": t3 - t2},
    }
    return data, facts


# ------------------------------------------------------------------ the decision


def decide_fusion(
    flat: Flat,
    target="cpu",
    budget: Budget | None = None,
    method: str = "greedy",
    rows: bool = True,
) -> FusionDecision:
    """Which values of `flat` to materialize, chosen by extraction from the fusion e-graph.
    method: "greedy" (default) or "exhaustive" (small programs only; tests). rows: the
    planner fuses reductions over trailing axes with the maps of their rows (row kernels):
    costed as one kernel."""
    loaded = load_fusion(flat)
    _depths(flat, loaded, rows)
    required = _required(flat)
    required_lets = {loaded.of_value[id(v)].name for v in required if id(v) in loaded.of_value}
    lets, report, classes, shared, row = _choose(
        loaded, required_lets, target, budget, method, rows
    )
    decision = _decision(flat, loaded, required, lets, report, classes)
    for inst in flat.body:
        let = loaded.of_value.get(id(inst.result))
        if let is not None and let.name in shared:
            decision.shared_pass[inst.result.name] = shared[let.name]
        if let is not None and let.name in row:
            decision.row_pass[inst.result.name] = row[let.name]
    return decision


def _depths(flat: Flat, loaded: _Loaded, rows: bool) -> None:
    """Per let, the reductions (other than row reductions), BLAS calls and concatenations on
    its longest path from the parameters: maps of one depth can share a kernel without a
    cycle (a group key of the cost model, like the planner's grouping)."""
    depth: dict[int, int] = {}
    merged = merged_axes(flat)
    for inst in flat.body:
        d = 0
        for o in inst.operands:
            if isinstance(o, Value):
                d = max(d, depth.get(id(o), 0))
        spec = OPS[inst.op]
        d_in = d
        if spec.kind == REDUCE:
            axes = merged.get(id(inst.result), tuple(sorted(inst.attrs["axes"])))
            rank = inst.operands[0].type.rank
            row = rows and bool(axes) and axes[0] > 0 and axes == tuple(range(axes[0], rank))
            d += 0 if row else 1
        elif spec.kind == DOT or inst.op in COPY_OPS:
            d += 1
        depth[id(inst.result)] = d
        let = loaded.of_value.get(id(inst.result))
        if let is not None:
            loaded.depth[let.name] = max(loaded.depth.get(let.name, 0), d)
            if spec.kind == REDUCE:
                loaded.reduce_depth[let.name] = d_in


def _required(flat: Flat) -> list:
    """Values that must be in buffers: results, and what BLAS calls and concatenations read
    (through views: they read arrays)."""
    producer = {id(i.result): i for i in flat.body}

    def source(o):
        while isinstance(o, Value) and id(o) in producer and producer[id(o)].op in VIEW_OPS:
            o = producer[id(o)].operands[0]
        return o

    required = [r for r in flat.results if isinstance(r, Value)]
    for inst in flat.body:
        if OPS[inst.op].kind == DOT or inst.op in COPY_OPS:
            required += [source(o) for o in inst.operands if isinstance(o, Value)]
    return required


def _decision(flat, loaded, required, lets, report, classes) -> FusionDecision:
    """Materialize the chosen values; an elementwise value equal to an earlier one (one e-class:
    the e-graph found them equal) is that value, computed once."""
    materialize = {id(v) for v in required}
    first: dict = {}
    same_as = {}
    for inst in flat.body:
        v = inst.result
        let = loaded.of_value.get(id(v))
        if let is None or loaded.kind[let.name] != "ew":
            continue
        key = (classes.get(let.name, let.name), v.type)
        if key in first:
            same_as[id(v)] = first[key]
            continue
        first[key] = v
        if let.name in lets:
            materialize.add(id(v))
    return FusionDecision(materialize, report, same_as)


def _choose(loaded: _Loaded, required_lets: set, target, budget, method: str, rows: bool):
    """(lets of the elementwise values to materialize, report): the e-graph and extraction."""
    from ..extract.fusion_cost import (
        FusionProblem,
        exhaustive_fusion,
        greedy_fusion,
        shared_pass_saving,
    )
    from ..extract.graph import load_json
    from ..extract.machine import machine

    data, facts = fusion_graph(loaded, budget)
    t1 = time.perf_counter()
    g = load_json(data)
    cls = {r: g.class_index[str(c)] for r, c in zip(facts["roots"], data["root_eclasses"])}
    multi = target == "cpu" and settings().multi_output  # planning/map_reduce.py: CPU only
    # row passes (planning/rowfusion.py) exist on both targets
    kernels = _Kernels(loaded, g, cls, required_lets, rows, multi, settings().multi_output)
    forced = kernels.forced
    report = FusionReport(
        nodes=facts["nodes"],
        classes=g.num_classes,
        stop_reason=facts["stop_reason"],
        iterations=facts["iterations"],
        method=method,
    )
    report.seconds = dict(facts["seconds"])
    ew_lets = [n for n in loaded.names if loaded.kind[n] == "ew"]
    if kernels.unsaturated or facts["stop_reason"] != "saturated":
        report.note = (
            "fusion rules not saturated within the budget: every elementwise value materialized"
        )
        report.values = report.forced = len(ew_lets)
        report.seconds["extract"] = time.perf_counter() - t1
        return set(ew_lets), report, {}, {}, {}
    problem = FusionProblem(
        g,
        list(forced.values()),
        list(kernels.candidates.values()),
        kernels.buffers,
        machine(target),
        frozenset(kernels.free),
    )
    if method == "exhaustive":
        choice = exhaustive_fusion(problem)
    else:  # the work budget, and what is left of the wall-clock cap
        b = fusion_budget(budget)
        left = max(0.0, b.seconds - (time.perf_counter() - t1))
        choice = greedy_fusion(problem, time_limit=left, work=b.work)
        if choice.stopped:
            report.note = f"fusion extraction stopped by its budget: {choice.stopped}"
    keep = choice.materialized | set(forced)
    lets = {n for n in ew_lets if cls[n] in keep}
    report.values = len(ew_lets)
    report.forced = sum(cls[n] in forced for n in ew_lets)
    report.materialized = len(lets) - report.forced
    report.inlined = len(ew_lets) - len(lets)
    report.cost_unfused, report.cost = choice.cost_unfused, choice.cost
    shared = {}
    for let, k in kernels.shared.items():  # a reduction in one pass with its space's maps?
        saving = shared_pass_saving(problem, choice.materialized, k)
        if saving > 0:
            shared[let] = saving
    report.shared, report.shared_saving = len(shared), sum(shared.values())
    row = {}
    for let, k in kernels.row_shared.items():  # a row reduction in one pass with its rows'?
        saving = shared_pass_saving(problem, choice.materialized, k)
        if saving > 0:
            row[let] = saving
    report.seconds["extract"] = time.perf_counter() - t1
    return lets, report, cls, shared, row


def _size(t: TensorType) -> int:
    return max(math.prod(t.shape), 1)


class _Kernels:
    """The fusion problem's parts, per e-class of a let: buffers (materialized anyway),
    free values (constants), forced kernels (reductions, required maps, returned views) and
    candidate kernels (maps extraction may inline). `unsaturated`: a map or reduction has no
    Map/ReduceMap node (saturation stopped early). multi: a reduction not in a row kernel is
    priced in one pass with the maps of its space at its input's depth (multi-output fusion,
    CPU); `shared` holds those reductions' kernels by let. row_multi: `row_shared` holds the
    kernels of the reductions over trailing axes (row kernels), whose one pass with the
    reductions and maps of their rows the decision prices too."""

    def __init__(
        self,
        loaded: _Loaded,
        g,
        cls: dict,
        required_lets: set,
        rows: bool,
        multi: bool = False,
        row_multi: bool = False,
    ):
        self.loaded, self.g, self.cls, self.rows, self.multi = loaded, g, cls, rows, multi
        self.row_multi = row_multi
        self.buffers, self.free, self.forced, self.candidates = {}, set(), {}, {}
        self.shared: dict = {}
        self.row_shared: dict = {}
        self.unsaturated = False
        for let in loaded.names:
            self.add(let, let in required_lets)
        for v, load in loaded.result_loads.items():  # a view returned: a kernel copies it
            t = loaded.type[v]
            self.forced.setdefault(cls[v], self._kernel(v, cls[load], _size(t), self._group(v, t)))
        for c in self.forced:
            self.candidates.pop(c, None)
        # a space with a row kernel: the planner gives its maps to the row kernel
        # (codegen/planning/rowfusion.py runs first), so a reduction there shares a pass only
        # with the other reductions of its space that read what it reads (a layer norm's gain
        # and bias gradients)
        rows = {k.group for k in self.forced.values() if k.reduction and k.group is not None}
        for let, k in list(self.shared.items()):
            if k.group in rows:
                self.shared[let] = k = dataclasses.replace(k, group=("alone", k.group))
                self.forced[k.cls] = k

    def add(self, let: str, required: bool) -> None:
        c, kind, t = self.cls[let], self.loaded.kind[let], self.loaded.type[let]
        if kind == "const":
            self.free.add(c)
        elif kind in ("param", "literal", "dot", "concat"):
            self.buffers[c] = (_size(t), t.dtype.itemsize)
        elif kind == "reduce":
            self.buffers[c] = (_size(t), t.dtype.itemsize)
            self.add_reduction(let)
        elif kind == "ew":
            m = self._nodes_of(c, "Map")
            if not m:
                self.unsaturated = True
                return
            k = self._kernel(let, self.g.children[m[0]][0], _size(t), self._group(let, t))
            if required:
                self.forced[c] = k
                self.buffers[c] = (_size(t), t.dtype.itemsize)
            else:
                self.candidates.setdefault(c, k)

    def add_reduction(self, let: str) -> None:
        rm = self._nodes_of(self.cls[let], "ReduceMap")
        if not rm:
            self.unsaturated = True
            return
        src, axes = self.loaded.reduce_input[let]
        trailing = bool(axes) and axes[0] > 0 and axes == tuple(range(axes[0], src.rank))
        group = self._group(let, src) if self.rows and trailing else None
        multi = group is None and self.multi
        if multi:  # its maps never read its result: they are one kernel boundary deeper
            group = tuple(d for d in src.shape if d != 1), self.loaded.reduce_depth.get(let, 0)
        k = self._kernel(let, self.g.children[rm[0]][0], _size(src), group)
        self.forced[self.cls[let]] = k = dataclasses.replace(k, reduction=not multi)
        if multi:
            self.shared[let] = k
        elif group is not None and self.row_multi:
            self.row_shared[let] = k

    def _nodes_of(self, c: int, op: str) -> list[int]:
        return [n for n in self.g.class_nodes[c] if self.g.ops[n] == op]

    def _group(self, let: str, t: TensorType) -> tuple:
        """Maps over one shape (unit axes aside) at one depth may share a kernel."""
        return tuple(d for d in t.shape if d != 1), self.loaded.depth.get(let, 0)

    def _kernel(self, let: str, body: int, space: int, group=None):
        from ..extract.fusion_cost import Kernel

        t = self.loaded.type[let]
        return Kernel(self.cls[let], body, space, _size(t) * t.dtype.itemsize, group)


__all__ = [
    "DEFAULT_BUDGET",
    "FusionBudget",
    "FusionDecision",
    "FusionReport",
    "decide_fusion",
    "fusion_budget",
    "fusion_graph",
    "load_fusion",
]
