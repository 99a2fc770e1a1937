"""Optimizing a function with loops and branches in ONE e-graph: the function is cut at its
control-flow ops (ir/regions.py), and every straight piece of it and of every body it reaches
(a body with loops of its own is cut the same way) is loaded into the same session, saturated
by the same rules in one run, and extracted jointly; the function is then put back together
with each piece and body replaced by its extracted form.

    fn2, units = optimize_with_bodies(fn, module, target="cpu")    # what dq.optimize does

A body is loaded once however many loops run it (keyed by the Function object). Each unit's
parameters are renamed apart (`u3.h`) before loading: the e-graph names a parameter by its
name, and two bodies' `%h` of different shapes must not be one e-class. A control-flow op
stays an op around its optimized bodies (its body is a function of the module, DLVM-style);
the loop rules that look through a body (ir/loop_rules.py) run after, on the extracted
program, so that they see what the e-graph found: a selector that rules/loops.egg folded to
a constant, a body value that algebra made loop-invariant (`h - h + w` is `w`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from ..cache import watching_time_cuts
from ..errors import DlvmError
from ..extract.machine import machine
from ..ir.control_flow import (
    CONTROL_FLOW_OPS,
    add_renamed,
    bodies,
    reachable_bodies,
    reaches_control_flow,
)
from ..ir.loop_rules import apply_loop_rules, inline
from ..ir.module import Const, Function, FunctionBuilder, Module, Value
from ..ir.regions import Piece, normalize, split
from ..ir.types import TupleType
from ..ir.verifier import verify_function
from .deadline import Deadline
from .optimize import (
    OptimizeResult,
    ShortOfTime,
    optimize_session,
    prepare_session,
    program_cost,
    schedule_for,
    scratch_session,
)
from .optimize_report import FunctionReport, OptimizeReport, user_rules_fired
from .rule_origin import blame_user_rules
from .rulefiles import read_rule_file
from .ruleset_schedule import Budget
from .stability import stable_rules_fired


@dataclass
class Unit:
    """A straight function loaded into the shared e-graph, and what became of it."""

    label: str  # "piece 0 of @f", "piece 1 of @f.body"
    function: Function  # as written (its parameters renamed apart)
    optimized: Function | None = None
    cost_before: float = 0.0
    cost_after: float = 0.0


@dataclass
class _Plan:
    """A function cut into pieces; its straight pieces' units; the plans of its bodies."""

    fn: Function
    params: list[Value]
    results: list
    pieces: list[Piece]
    units: dict[int, Unit] = field(default_factory=dict)  # id(piece) -> its unit


class _Planner:
    def __init__(self, module: Module | None):
        self.module = module
        self.plans: dict[int, _Plan] = {}  # id(Function) -> plan (each body once)
        self.units: list[Unit] = []

    def plan(self, fn: Function) -> _Plan:
        hit = self.plans.get(id(fn))
        if hit is not None:
            return hit
        params, nodes, results = normalize(fn, self.module)
        pieces = split(params, nodes, results, f"{fn.name}.piece")
        p = self.plans[id(fn)] = _Plan(fn, params, results, pieces)
        for k, piece in enumerate(pieces):
            if piece.region is None:
                unit = Unit(f"piece {k} of @{fn.name}", _apart(piece.function, len(self.units)))
                self.units.append(unit)
                p.units[id(piece)] = unit
            else:
                for body in bodies(piece.region.inst.attrs):
                    self.plan(body)
        return p


def _apart(fn: Function, k: int) -> Function:
    """fn with its parameters renamed `u{k}.{name}` (one e-class per unit's parameter)."""
    b = FunctionBuilder(fn.name, fn.param_types, [f"u{k}.{p.name}" for p in fn.params])
    outs = inline(b, fn, list(b.params))
    outs = [
        o if isinstance(o, Value) else b.emit("literal", [], value=o.value, type=o.type)
        for o in outs
    ]
    return b.finish(outs[0] if not isinstance(fn.result_type, TupleType) else outs)


def straight_units(fn: Function, module: Module | None = None) -> list[Unit]:
    """The straight pieces of fn and of every body it reaches, each once, in load order."""
    planner = _Planner(module)
    planner.plan(fn)
    return planner.units


def optimize_with_bodies(fn: Function, module: Module | None, optimize_units) -> tuple:
    """(fn rebuilt from its optimized units, the units). `optimize_units(functions)` returns
    one Function per given straight function, optimized together in one e-graph session
    (egraph/optimize.py passes its session's joint optimize)."""
    planner = _Planner(module)
    planner.plan(fn)
    units = planner.units
    for unit, new in zip(units, optimize_units([u.function for u in units])):
        unit.optimized = new
    if all(u.optimized is None or u.optimized is u.function for u in units):
        return fn, units  # nothing cheaper found: the function as written
    return _rebuild(planner, fn, {}), units


def _rebuild(planner: _Planner, fn: Function, rebuilt: dict) -> Function:
    """fn put back together from its pieces: straight ones as their units' chosen form
    inlined, control-flow ops around their rebuilt bodies."""
    hit = rebuilt.get(id(fn))
    if hit is not None:
        return hit
    p = planner.plans[id(fn)]
    b = FunctionBuilder(fn.name, fn.param_types, [q.name for q in fn.params])
    env: dict[int, object] = {id(q): v for q, v in zip(p.params, b.params)}

    def get(o):
        return o if isinstance(o, Const) else env[id(o)]

    for piece in p.pieces:
        if piece.region is None:
            unit = p.units[id(piece)]
            outs = inline(b, unit.optimized or unit.function, [get(v) for v in piece.inputs])
            for v, o in zip(piece.outputs, outs):
                env[id(v)] = o
            continue
        inst = piece.region.inst
        attrs = dict(inst.attrs)
        for key in ("cond", "body"):
            if key in attrs:
                attrs[key] = _rebuild(planner, attrs[key], rebuilt)
        if "branches" in attrs:
            attrs["branches"] = tuple(_rebuild(planner, f, rebuilt) for f in attrs["branches"])
        r = b.emit(inst.op, [get(o) for o in inst.operands], location=inst.location, **attrs)
        if isinstance(r.type, TupleType):
            outs = [b.emit("extract", [r], index=k) for k in range(len(r.type.elements))]
        else:
            outs = [r]
        for v, o in zip(piece.outputs, outs):
            env[id(v)] = o
    results = [get(r) for r in p.results]
    results = [
        o if isinstance(o, Value) else b.emit("literal", [], value=o.value, type=o.type)
        for o in results
    ]
    out = b.finish(results if isinstance(fn.result_type, TupleType) else results[0])
    out.location, out.adjoint = fn.location, fn.adjoint
    rebuilt[id(fn)] = out
    return out


def optimize_loops(
    module, fn, rules, target, budget, extractor, schedule, time_limit, *rest, guard=None
):
    """A function with loops or branches: its straight pieces and every body's, optimized in
    one e-graph session by one saturation and one joint extraction (egraph/optimize_loops.py);
    each unit keeps its original form unless the extracted one is cheaper and verifies. The
    report's costs are the units' costs summed, each body counted once (not per iteration).
    guard: asked about each unit the e-graph would replace, as by egraph/optimize.optimize."""
    # no deadline given: the rules are compiled and the clock started only when an e-graph is
    # built (a cache hit builds none: a thread compiling a scan of another length never enters
    # egglog, which a daemon thread must not be inside of when the interpreter exits)
    given = rest[1] if len(rest) > 1 else None
    state: dict = {}

    def joint(functions: list[Function]) -> list[Function]:
        if not functions:
            return []
        key = _joint_key(functions, rules, target, budget, extractor, schedule, time_limit)
        key += (guard is not None,)  # a guarded choice is not an unguarded one
        with _JOINT_LOCK:
            hit = _JOINT.get(key)
        if hit is not None:  # the same straight units (a scan of another length, say)
            chosen, saved = hit
            state.update(saved)
            return [old if new is None else new for old, new in zip(functions, chosen)]
        with watching_time_cuts() as cuts:
            out = built(functions)
        if not cuts and "short" not in state:
            chosen = [None if new is old else new for old, new in zip(functions, out)]
            with _JOINT_LOCK:
                if len(_JOINT) > 64:
                    _JOINT.clear()
                _JOINT[key] = (chosen, dict(state))
        return out

    def built(functions: list[Function]) -> list[Function]:
        deadline = given
        if deadline is None:
            prepare_session(rules)  # before the clock starts (see prepare_session)
            deadline = Deadline(budget.seconds)
        with scratch_session(rules) as session:
            progs = [session.add_function(f, module) for f in functions]
            try:
                res = optimize_session(
                    session,
                    progs,
                    schedule=schedule,
                    budget=budget,
                    target=target,
                    extractor=extractor,
                    time_limit=time_limit,
                    deadline=deadline,
                )
            except ShortOfTime as e:
                state["short"] = str(e)
                return list(functions)
            state["res"] = res
            if rules:
                state["fired"] = user_rules_fired(session, res.saturation)
            return [
                _chosen(old, new, session, res, module, target, state, guard)
                for old, new in zip(functions, res.functions)
            ]

    new, units = optimize_with_bodies(fn, module, joint)
    # the loop rules on the extracted program: they see what the e-graph simplified (a
    # selector folded by rules/loops.egg, a body value that became invariant)
    new = apply_loop_rules(new, batch=False)
    res = state.get("res")
    costs = state.get("costs", [])
    before = sum(c[0] for c in costs)
    after = sum(c[1] for c in costs)
    fr = FunctionReport(
        fn.name,
        before,
        after,
        res.saturation if res is not None else None,
        res.extraction.method if res is not None else extractor,
        res.extraction.status if res is not None else "skipped",
        sum(1 for c in res.graph.classes if res.graph.is_term_class(c)) if res else 0,
        len(fn.body),
        len(new.body),
        note=f"{len(units)} straight pieces and bodies in one e-graph"
        + (f"; time budget: {state['short']}" if "short" in state else ""),
    )
    if res is not None:
        fr.seconds = dict(res.seconds)
    fr.user_rules = state.get("fired", [])
    fr.never_slower = list(state.get("guard", []))
    return new, fr


# the straight units of a function with loops, as text (and the settings) -> what the one
# e-graph chose for each (None: kept as written), and its report's state. A process cache: a
# second compile of the same pieces and bodies (dq.jit at another scan length, whose pieces
# around the loop are the same) builds no e-graph.
_JOINT: dict[tuple, tuple] = {}
_JOINT_LOCK = threading.Lock()


def _joint_key(functions, rules, target, budget, extractor, schedule, time_limit) -> tuple:
    texts = tuple(str(f) for f in functions)
    mine = tuple(read_rule_file(r)[0] for r in rules) if rules else ()
    profile = machine(target).profile
    return (texts, mine, target, repr(budget), extractor, repr(schedule), time_limit, profile)


def _chosen(old, new, session, res, module, target, state, guard=None) -> Function:
    """`new` where it verifies and is cheaper than `old` (or as cheap in fewer instructions),
    or where a numerical-stability rewrite fired (stability outranks the cost model,
    egraph/stability.py, as for a function without loops); else `old`. An ill-typed `new` that a user's rule made is the user's error."""
    before = program_cost(old, module, target)
    try:
        verify_function(new, module)
        after = program_cost(new, module, target)
    except DlvmError as e:
        blamed = blame_user_rules(e, session, res.saturation)
        if blamed is not e:
            raise blamed from None
        after = math.inf
    stable = bool(res.saturation) and bool(stable_rules_fired(res.saturation.rule_matches))
    # the cost model prices a program's DAG (two equal instructions are one let, priced once),
    # so a program whose only gain is duplicates gone (the LSTM's `keep` body computes its
    # forward twice: 16 products where 8 do) costs the same: fewer instructions break the tie
    fewer = after <= before and len(new.body) < len(old.body)
    keep = after < before or fewer or (stable and after < math.inf and new is not old)
    if keep and guard is not None and new is not old:  # the planned programs compared
        names = tuple(stable_rules_fired(res.saturation.rule_matches)) if stable else ()
        choice = guard(old, new, module, names)
        state.setdefault("guard", []).append(f"{old.name}: {choice}")
        keep = choice.kept == "optimized"
    state.setdefault("costs", []).append((before, after if keep else before))
    return new if keep else old


def optimize_function_with_loops(module: Module, name: str, rules=(), target="cpu", guard=None):
    """dq.optimize's result for function `name` (which has loops or branches) of `module`, with
    the default budget, schedule and extractor: what dq.jit / dq.compile run (pipeline/loops.py);
    a cache hit (the same straight pieces and bodies) builds no e-graph, and loads no rules."""
    rules = list(rules)
    fn = module[name]
    with_loops = bodies_optimized_with(module, [name])
    new, fr = optimize_loops(
        module, fn, rules, target, Budget.of(None), "greedy", schedule_for(rules), 10.0, guard=guard
    )
    out = Module(module.name, module.stage)
    out.add(new)
    put_bodies(out, with_loops)
    report = OptimizeReport(str(target))
    report.functions[name] = fr
    return OptimizeResult(out, report)


def bodies_optimized_with(module: Module, names) -> dict[int, Function]:
    """The bodies that functions `names` with loops run (id -> Function): they are optimized
    in their caller's e-graph, not on their own."""
    out: dict[int, Function] = {}
    for name in names:
        fn = module[name]
        if not fn.is_declaration and reaches_control_flow(fn, module):
            out.update((id(b), b) for b in reachable_bodies(fn))
    return out


def put_bodies(out: Module, bodies_as_written: dict[int, Function]) -> None:
    """Make `out` hold the bodies its optimized functions run: a rebuilt body takes the place
    of the body it was rebuilt from (its name); one rebuilt twice (two callers) is renamed."""
    for fn in list(out.functions.values()):
        for b in reachable_bodies(fn):
            held = out.functions.get(b.name)
            if held is b:
                continue
            if held is None or id(held) in bodies_as_written:
                out.functions[b.name] = b
            else:  # the name is another function's (a body rebuilt for two callers)
                add_renamed(out, b)


def has_loops(fn: Function) -> bool:
    return any(i.op in CONTROL_FLOW_OPS for i in fn.body)


__all__ = [
    "Unit",
    "has_loops",
    "optimize_function_with_loops",
    "optimize_loops",
    "optimize_with_bodies",
    "straight_units",
]
