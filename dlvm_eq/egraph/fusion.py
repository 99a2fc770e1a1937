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
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import DlvmError
from ..ir.inline import Flat
from ..ir.module import Const as IRConst
from ..ir.module import Value
from ..ir.ops import CAST, DOT, ELEMENTWISE_KINDS, LITERAL, OPS, REDUCE, transpose_perm
from ..ir.types import TensorType
from ..ir.window_ops import WINDOW_OPS
from .schedule import Budget
from .fusion_report import FusionReport
from .terms import egg_float, egg_string, egg_vec, let_name

FUSIBLE_KINDS = ELEMENTWISE_KINDS + (CAST,)
VIEW_OPS = ("transpose", "shapeCast", "padShape", "squeezeShape", "broadcast")
# numpy/CuPy steps: they read and write buffers (convolutions and pools too: im2col + GEMM)
COPY_OPS = ("concatenate", "slice") + WINDOW_OPS
DEFAULT_BUDGET = Budget(iterations=12, nodes=200_000, seconds=2.0)


@dataclass
class FusionDecision:
    materialize: set               # id() of the IR values to keep in buffers
    report: FusionReport
    same_as: dict = field(default_factory=dict)   # id(value) -> an earlier Value it equals


# ------------------------------------------------------------------ the loader

@dataclass
class _Loaded:
    lines: list = field(default_factory=list)          # Term lets (bound as marker rows)
    load_lines: list = field(default_factory=list)     # Scalar lets of result loads (globals)
    lets: list = field(default_factory=list)          # let names, in order
    kind: dict = field(default_factory=dict)          # let -> param, const, ew, view, ...
    type: dict = field(default_factory=dict)          # let -> TensorType
    of_value: dict = field(default_factory=dict)      # id(IR Value) -> let
    result_loads: dict = field(default_factory=dict)  # view result let -> let of (Load it)
    reduce_input: dict = field(default_factory=dict)  # reduce let -> (input type, axes)
    depth: dict = field(default_factory=dict)         # let -> kernel boundaries above it


class _Loader:
    def __init__(self):
        self.out = _Loaded()
        self.memo: dict[str, str] = {}

    def let(self, term: str, t: TensorType, kind: str) -> str:
        name = self.memo.get(term)
        if name is None:
            name = self.memo[term] = let_name("fu", len(self.out.lets))
            self.out.lines.append(f"(let {name} {term})")
            self.out.lets.append(name)
            self.out.kind[name], self.out.type[name] = kind, t
        return name

    def operand(self, o, shape) -> str:
        if isinstance(o, IRConst):
            term = self.let(f"(Const {egg_float(o.value)} {egg_string(str(o.type.dtype))})",
                            TensorType((), o.type.dtype), "const")
            t = TensorType((), o.type.dtype)
        else:
            term, t = self.out.of_value[id(o)], o.type
        if tuple(t.shape) != tuple(shape):
            term = self.let(f"(Broadcast {term} {egg_vec(shape)})", t.with_shape(tuple(shape)), "view")
        return term


def load_fusion(flat: Flat) -> _Loaded:
    """The egglog commands of `flat` for the fusion e-graph: one let per distinct term."""
    ld = _Loader()
    out = ld.out
    for p in flat.params:
        out.of_value[id(p)] = ld.let(f"(Var {egg_string(p.name)})", p.type, "param")
    for inst in flat.body:
        spec = OPS[inst.op]
        t = inst.result.type
        a = inst.attrs
        if spec.kind == LITERAL:
            if np.ndim(a["value"]) == 0:
                v = np.asarray(a["value"]).item()
                out.of_value[id(inst.result)] = ld.let(
                    f"(Const {egg_float(float(v))} {egg_string(str(t.dtype))})", t, "const")
            else:
                out.of_value[id(inst.result)] = ld.let(f"(Lit {egg_string(inst.result.name)})", t, "literal")
            continue
        if spec.kind in FUSIBLE_KINDS:
            args = [ld.operand(o, t.shape) for o in inst.operands]
            if inst.op == "dataTypeCast":
                args.append(egg_string(str(a["dtype"])))
            term, kind = f"({spec.egg} {' '.join(args)})", "ew"
        elif inst.op in VIEW_OPS:
            x = ld.operand(inst.operands[0], inst.operands[0].type.shape)
            if inst.op == "transpose":
                term = f"(Transpose {x} {egg_vec(transpose_perm(inst.operands[0].type.rank, a))})"
            elif inst.op == "broadcast":
                term = f"(Broadcast {x} {egg_vec(t.shape)})"
            else:
                term = f"(ShapeCast {x} {egg_vec(t.shape)})"
            kind = "view"
        elif spec.kind == REDUCE:
            x = ld.operand(inst.operands[0], inst.operands[0].type.shape)
            axes = sorted(a["axes"])
            head = f"{egg_string(a['combinator'])} {egg_float(a['init'])}"
            term = (f"(Reduce {x} {head} {axes[0]})" if len(axes) == 1
                    else f"(ReduceMap (Load {x}) {head} {egg_vec(axes)})")
            kind = "reduce"
        elif spec.kind == DOT:
            term, kind = f"(Dot {' '.join(ld.operand(o, o.type.shape) for o in inst.operands)})", "dot"
        elif inst.op in COPY_OPS:   # opaque here: its operands are buffers
            term, kind = f"(Var {egg_string(inst.op + ' %' + inst.result.name)})", "concat"
        else:
            raise DlvmError(f"the fusion stage has no case for op {inst.op}")
        name = ld.let(term, t, kind)
        out.of_value[id(inst.result)] = name
        if kind == "reduce":
            out.reduce_input[name] = (inst.operands[0].type, tuple(sorted(a["axes"])))
    for r in flat.results:
        if isinstance(r, Value) and out.kind[out.of_value[id(r)]] == "view":
            v = out.of_value[id(r)]
            out.result_loads[v] = let_name("fuload", len(out.result_loads))
            # a Load is a Scalar, not a Term: an egglog global (one per returned view)
            out.load_lines.append(f"(let {out.result_loads[v]} (Load {v}))")
    return out


# ------------------------------------------------------------------ the e-graph

# egglog's EGraph belongs to the thread that made it (pyo3 `unsendable`): one per thread
_local = threading.local()


def _base_session():
    """schema.egg's declarations + fusion.egg, once per thread; each program runs between
    push and pop."""
    s = getattr(_local, "session", None)
    if s is None:
        from .fusion_rules import schema_declarations
        from .rulefiles import rule_file
        from .session import EGraphSession
        s = EGraphSession(schema=False)
        s.add_rules_text(schema_declarations(), str(rule_file("schema.egg")))
        s.declare_marker()
        s.add_rules_file(rule_file("fusion.egg"))
        _local.session = s
    return s


def fusion_graph(loaded: _Loaded, budget: Budget | None = None) -> tuple[dict, dict]:
    """(serialized e-graph JSON with every let and result load as a root, saturation facts)."""
    from .saturate import saturate
    from .schedule import Schedule
    budget = budget or DEFAULT_BUDGET
    s = _base_session()
    s.run_text("(push)")
    try:
        t0 = time.perf_counter()
        s.run_lines(loaded.lines, "<fusion program>")
        if loaded.load_lines:
            s.run_text("\n".join(loaded.load_lines) + "\n", "<fusion program>")
        t1 = time.perf_counter()
        # the one saturation driver; the fusion e-graph has no analysis ruleset
        sat = saturate(s, Schedule(("fusion",)), budget, analysis=None)
        t2 = time.perf_counter()
        roots = loaded.lets + list(loaded.result_loads.values())
        data = s.serialize(roots).data
        t3 = time.perf_counter()
    except BaseException:
        _local.session = None      # egglog may be left in any state: never reuse it
        raise
    s.run_text("(pop)")
    if len(data.get("root_eclasses", ())) != len(roots):
        raise DlvmError("fusion e-graph: serialized roots do not match the program's values")
    facts = {"stop_reason": sat.stop_reason, "iterations": sat.iterations, "nodes": sat.nodes,
             "roots": roots, "seconds": {"load": t1 - t0, "saturate": t2 - t1, "serialize": t3 - t2}}
    return data, facts


# ------------------------------------------------------------------ the decision

def decide_fusion(flat: Flat, target="cpu", budget: Budget | None = None,
                  method: str = "greedy", rows: bool = True) -> FusionDecision:
    """Which values of `flat` to materialize, chosen by extraction from the fusion e-graph.
    method: "greedy" (default) or "exhaustive" (small programs only; tests). rows: the
    planner fuses reductions over trailing axes with the maps of their rows (row kernels):
    costed as one kernel."""
    loaded = load_fusion(flat)
    _depths(flat, loaded, rows)
    required = _required(flat)
    required_lets = {loaded.of_value[id(v)] for v in required if id(v) in loaded.of_value}
    lets, report, classes = _choose(loaded, required_lets, target, budget, method, rows)
    return _decision(flat, loaded, required, lets, report, classes)


def _depths(flat: Flat, loaded: _Loaded, rows: bool) -> None:
    """Per let, the reductions (other than row reductions), BLAS calls and concatenations on
    its longest path from the parameters: maps of one depth can share a kernel without a
    cycle (a group key of the cost model, like the planner's grouping)."""
    depth: dict[int, int] = {}
    for inst in flat.body:
        d = 0
        for o in inst.operands:
            if isinstance(o, Value):
                d = max(d, depth.get(id(o), 0))
        spec = OPS[inst.op]
        if spec.kind == REDUCE:
            axes = tuple(sorted(inst.attrs["axes"]))
            rank = inst.operands[0].type.rank
            row = rows and bool(axes) and axes[0] > 0 and axes == tuple(range(axes[0], rank))
            d += 0 if row else 1
        elif spec.kind == DOT or inst.op in COPY_OPS:
            d += 1
        depth[id(inst.result)] = d
        let = loaded.of_value.get(id(inst.result))
        if let is not None:
            loaded.depth[let] = max(loaded.depth.get(let, 0), d)


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
        if let is None or loaded.kind[let] != "ew":
            continue
        key = (classes.get(let, let), v.type)
        if key in first:
            same_as[id(v)] = first[key]
            continue
        first[key] = v
        if let in lets:
            materialize.add(id(v))
    return FusionDecision(materialize, report, same_as)


def _choose(loaded: _Loaded, required_lets: set, target, budget, method: str, rows: bool):
    """(lets of the elementwise values to materialize, report): the e-graph and extraction."""
    from ..extract.fusion_cost import FusionProblem, Kernel, exhaustive_fusion, greedy_fusion
    from ..extract.graph import load_json
    from ..extract.machine import machine

    data, facts = fusion_graph(loaded, budget)
    t1 = time.perf_counter()
    g = load_json(data)
    cls = {r: g.class_index[str(c)] for r, c in zip(facts["roots"], data["root_eclasses"])}
    kinds, types = loaded.kind, loaded.type

    def nodes_of(c: int, op: str) -> list[int]:
        return [n for n in g.class_nodes[c] if g.ops[n] == op]

    def size(t: TensorType) -> int:
        return max(math.prod(t.shape), 1)

    def kernel(let: str, body: int, space: int, group=None) -> Kernel:
        t = types[let]
        return Kernel(cls[let], body, space, size(t) * t.dtype.itemsize, group)

    buffers, free, forced, candidates = {}, set(), {}, {}
    unsaturated = False
    for let in loaded.lets:
        c, kind, t = cls[let], kinds[let], types[let]
        if kind == "const":
            free.add(c)
        elif kind in ("param", "literal", "dot", "concat"):
            buffers[c] = (size(t), t.dtype.itemsize)
        elif kind == "reduce":
            buffers[c] = (size(t), t.dtype.itemsize)
            rm = nodes_of(c, "ReduceMap")
            if not rm:
                unsaturated = True
                continue
            src, axes = loaded.reduce_input[let]
            trailing = bool(axes) and axes[0] > 0 and axes == tuple(range(axes[0], src.rank))
            group = (tuple(d for d in src.shape if d != 1), loaded.depth.get(let, 0)) \
                if rows and trailing else None
            forced[c] = dataclasses.replace(kernel(let, g.children[rm[0]][0], size(src), group),
                                            reduction=True)
        elif kind == "ew":
            m = nodes_of(c, "Map")
            if not m:
                unsaturated = True
                continue
            k = kernel(let, g.children[m[0]][0], size(t),
                       (tuple(d for d in t.shape if d != 1), loaded.depth.get(let, 0)))
            if let in required_lets:
                forced[c] = k
                buffers[c] = (size(t), t.dtype.itemsize)
            else:
                candidates.setdefault(c, k)
    for v, load in loaded.result_loads.items():       # a view returned: a kernel copies it
        t = types[v]
        forced.setdefault(cls[v], Kernel(cls[v], cls[load], size(t), size(t) * t.dtype.itemsize,
                                         (tuple(d for d in t.shape if d != 1), loaded.depth.get(v, 0))))
    for c in forced:
        candidates.pop(c, None)
    report = FusionReport(nodes=facts["nodes"], classes=g.num_classes, stop_reason=facts["stop_reason"],
                          iterations=facts["iterations"], method=method)
    report.seconds = dict(facts["seconds"])
    ew_lets = [n for n in loaded.lets if kinds[n] == "ew"]
    if unsaturated or facts["stop_reason"] != "saturated":
        report.note = "fusion rules not saturated within the budget: every elementwise value materialized"
        report.values = report.forced = len(ew_lets)
        report.seconds["extract"] = time.perf_counter() - t1
        return set(ew_lets), report, {}
    problem = FusionProblem(g, list(forced.values()), list(candidates.values()), buffers,
                            machine(target), frozenset(free))
    choice = exhaustive_fusion(problem) if method == "exhaustive" else greedy_fusion(problem)
    keep = choice.materialized | set(forced)
    lets = {n for n in ew_lets if cls[n] in keep}
    report.values = len(ew_lets)
    report.forced = sum(cls[n] in forced for n in ew_lets)
    report.materialized = len(lets) - report.forced
    report.inlined = len(ew_lets) - len(lets)
    report.cost_unfused, report.cost = choice.cost_unfused, choice.cost
    report.seconds["extract"] = time.perf_counter() - t1
    return lets, report, cls


__all__ = ["DEFAULT_BUDGET", "FusionDecision", "FusionReport", "decide_fusion", "fusion_graph",
           "load_fusion"]
