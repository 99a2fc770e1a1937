"""Optimizing a function with loops and branches in ONE e-graph: the function is cut at its
control-flow ops (ir/regions.py), and every straight piece of it and of every body it reaches
(a body with loops of its own is cut the same way) is loaded into the same session, saturated
by the same rules in one run, and extracted jointly; the function is then put back together
with each piece and body replaced by its extracted form.

    fn2, units = optimize_with_bodies(fn, module, target="cpu")    # what dq.optimize does

A body is loaded once however many loops run it (keyed by the Function object). Each unit's
parameters are renamed apart (`u3.h`) before loading: the e-graph names a parameter by its
name, and two bodies' `%h` of different shapes must not be one e-class. A control-flow op
stays an op around its optimized bodies (its body is a function of the module, DLVM-style),
unless rules/loops.egg decided it runs one body (control_regions.py: a cond or switch whose
selector the caller's e-graph proves constant, a scan of one step): that body's optimized
program is then put in place of the op (`_body_in_place`).

Loop motion is in the e-graph. Every straight piece of a body that one scan of n >= 2 steps
runs (one piece, or several around a cond or scan inside it) is tied to its scan by facts
(loop_motion.py, `loop_facts`): each per-step parameter is a row of the stacked operand
(StepOf), each `with` parameter the outer operand's value (Once). rules/loops.egg lifts
invariant ops into Once and batches x_t @ W into a StepOf of one product; extraction prices
what is under them at 1/n a step; the unloader turns each picked Once/StepOf into a new body
parameter with the function that computes it before the loop, and `_before_loop` puts that
before the scan, or before an outer scan where it reads only that scan's withs (a nested
scan's invariant, `loop_motion.hoists`). A body value that algebra made invariant (`h - h + w`
is `w`) moves too.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from ..cache import watching_time_cuts
from ..errors import DlvmError
from ..extract.machine import machine
from ..ir.branch_motion import hoist_branch_common
from ..ir.control_flow import (
    CONTROL_FLOW_OPS,
    SCAN,
    WHILE,
    add_renamed,
    bodies,
    reachable_bodies,
    reaches_control_flow,
)
from ..ir.inline import live_instructions
from ..ir.loop_rules import apply_loop_rules, inline, one_step
from ..ir.module import Const, Function, FunctionBuilder, Module, Value
from ..ir.regions import Piece, normalize, split
from ..ir.types import TupleType
from ..ir.verifier import verify_function
from .control_regions import ControlRegion, control_regions, decided, region_facts
from .deadline import Deadline
from .fusion_ahead import planning_ahead
from .loader import Lifted
from .loop_motion import (
    LoopBody,
    before_while,
    emit_shared,
    hoists,
    loop_body,
    loop_facts,
    row,
)
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
    loop: LoopBody | None = None
    lifted: list[Lifted] = field(default_factory=list)  # computed before the loop (unload.py)


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
        self.runs: dict[int, list] = {}  # id(body) -> the control-flow instructions running it
        self.regions: list[ControlRegion] = []  # conds, switches, one-step scans (Cond, ...)
        self.emitted: dict[int, tuple] = {}  # id(builder) -> (it, what _before_loop emitted)

    def planned(self, fn: Function) -> _Plan:
        """The plan of fn and every body it reaches, with each once-run scan body's unit
        tied to its scan (LoopBody)."""
        top = self.plan(fn)
        for p in self.plans.values():
            runs = self.runs.get(id(p.fn), [])
            if (
                len(runs) != 1
                or runs[0].op not in (SCAN, WHILE)
                or runs[0].attrs["body"] is not p.fn
            ):
                continue  # (a while's test is not its body)
            for piece in p.pieces:  # every straight piece of the body (loop_motion.py)
                unit = p.units.get(id(piece))
                if unit is not None:
                    unit.loop = loop_body(runs[0], p.params, piece, unit.function)
        self.regions = control_regions(self.plans.values())
        return top

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
                    self.runs.setdefault(id(body), []).append(piece.region.inst)
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
    planner.planned(fn)
    return planner.units


def optimize_with_bodies(fn: Function, module: Module | None, optimize_units) -> tuple:
    """(fn rebuilt from its optimized units, the units). `optimize_units(units, regions)`
    sets each unit's `optimized` (and `lifted`: what it computes before its loop) and each
    region's `decision` (control_regions.py), in one e-graph session."""
    planner = _Planner(module)
    planner.planned(fn)
    units = planner.units
    optimize_units(units, planner.regions)
    unchanged = all(u.optimized is None or u.optimized is u.function for u in units)
    if unchanged and all(r.decision is None for r in planner.regions):
        return fn, units  # nothing cheaper found: the function as written
    return _rebuild(planner, fn, {}), units


def _rebuild(planner: _Planner, fn: Function, rebuilt: dict) -> Function:
    """fn put back together from its pieces: straight ones as their units' chosen form
    inlined, control-flow ops around their rebuilt bodies."""
    hit = rebuilt.get(id(fn))
    if hit is not None:
        return hit
    p = planner.plans[id(fn)]
    lifted = hoists(planner.plans, planner.runs, fn)  # computed before fn's scan (or further out)
    steps = [x for x in lifted if x.step]
    types, names = list(fn.param_types), [q.name for q in fn.params]
    if lifted:  # the body's new parameters: rows after its xs, values after its withs
        at = len(fn.params) - _withs(planner, fn)
        types[at:at] = [row(x.before.result_type) for x in steps]
        names[at:at] = [x.name for x in steps]
        types += [x.before.result_type for x in lifted if not x.step]
        names += [x.name for x in lifted if not x.step]
    b = FunctionBuilder(fn.name, types, names)
    new_params = {n: v for n, v in zip(names, b.params)}
    old = [new_params[q.name] for q in fn.params]
    env: dict[int, object] = {id(q): v for q, v in zip(p.params, old)}

    def get(o):
        return o if isinstance(o, Const) else env[id(o)]

    taken = {id(r.piece): r for r in planner.regions if r.decision is not None}
    for piece in p.pieces:
        if id(piece) in taken:  # rules/loops.egg put a body in place of the op
            r = taken[id(piece)]
            outs = _body_in_place(b, planner, r, [get(o) for o in r.inst.operands], rebuilt)
            for v, o in zip(piece.outputs, outs):
                env[id(v)] = o
            continue
        if piece.region is None:
            unit = p.units[id(piece)]
            args = [get(v) for v in piece.inputs]
            if unit.optimized is not None and unit.lifted:
                args += [new_params[x.name] for x in unit.lifted]
            outs = inline(b, unit.optimized or unit.function, args)
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
        operands = [get(o) for o in inst.operands]
        if inst.op == SCAN and inst.attrs["body"] is not None:
            here = {x.name for x in lifted}  # handed on from fn's own parameters
            operands, attrs = _before_loop(b, planner, inst, operands, attrs, here, new_params)
        elif inst.op == WHILE and hoists(planner.plans, planner.runs, inst.attrs["body"]):
            memo = planner.emitted.setdefault(id(b), (b, {}))[1]
            lifted_here = hoists(planner.plans, planner.runs, inst.attrs["body"])
            operands, attrs = before_while(b, lifted_here, operands, attrs, memo, inst.location)
        r = b.emit(inst.op, operands, location=inst.location, **attrs)
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
    # a unit inlined with a tuple result leaves its own tuple unread: later rules count uses
    # (ir/loop_sums.py defers a sum only where its update has one reader)
    out.body = live_instructions(out.body, [out.ret])
    out.location, out.adjoint = fn.location, fn.adjoint
    rebuilt[id(fn)] = out
    return out


def _body_in_place(b, planner: _Planner, r: ControlRegion, ops: list, rebuilt) -> list:
    """The results of region r (its operands `ops`, rebuilt) emitted as the body the rules
    decided it runs: the taken branch of a cond or switch, or a one-step scan's body once."""
    inst = r.inst
    if inst.op == SCAN:
        body = _rebuild(planner, inst.attrs["body"], rebuilt)
        return one_step(b, body, inst.attrs, ops, inst.location)
    branch = _rebuild(planner, inst.attrs["branches"][r.decision], rebuilt)
    return inline(b, branch, ops[1:], inst.location)


def _withs(planner: _Planner, body: Function) -> int:
    (inst,) = planner.runs[id(body)]
    return len(body.params) - inst.attrs["carries"] - inst.attrs.get("xs", 0)


def _before_loop(b, planner: _Planner, inst, operands: list, attrs: dict, here, params):
    """A scan's operands and attributes with what its body's units lifted (rules/loops.egg's
    Once and StepOf, loop_motion.hoists) computed before it: rows as new xs, values as new
    withs; one named in `here` was computed further out and is the parameter `params[name]`."""
    lifted = hoists(planner.plans, planner.runs, inst.attrs["body"])
    if not lifted:
        return operands, attrs
    made = []
    # equal lifted instructions once per function (the builder held: its id stays its own)
    memo = planner.emitted.setdefault(id(b), (b, {}))[1]
    for x in lifted:
        if x.name in here:
            made.append(params[x.name])
            continue
        v = emit_shared(b, x.before, [operands[k] for k in x.sources], memo, inst.location)
        if isinstance(v, Const):
            v = b.emit("literal", [], value=v.value, type=v.type)
        made.append(v)
    nc, nx = inst.attrs["carries"], inst.attrs["xs"]
    rows = [v for v, x in zip(made, lifted) if x.step]
    once = [v for v, x in zip(made, lifted) if not x.step]
    new = operands[: nc + nx] + rows + operands[nc + nx :] + once
    return new, dict(attrs, xs=nx + len(rows))


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

    def joint(units: list[Unit], regions: list[ControlRegion]) -> None:
        if not units:
            return  # (a region's selector comes from a straight unit; a scan runs a body)
        functions = [u.function for u in units]
        loops = [u.loop for u in units]
        key = _joint_key(functions, rules, target, budget, extractor, schedule, time_limit)
        key += (tuple(None if lp is None else (lp.label, tuple(lp.index)) for lp in loops),)
        key += (guard is not None,)  # a guarded choice is not an unguarded one
        key += (tuple(r.signature(units) for r in regions),)  # (a scan's length, a selector's unit)
        with _JOINT_LOCK:
            hit = _JOINT.get(key)
        # the same straight units (a scan of another length, say); a choice that computes
        # values before a loop has that loop's length in its types: only for that length
        trips = tuple(lp.trips if lp is not None else 0 for lp in loops)
        if hit is not None and (hit[2] is None or hit[2] == trips):
            chosen, saved, _ = hit
            state.update(saved)
            for u, got in zip(units, chosen):
                u.optimized, u.lifted = (u.function, []) if got is None else got
            for r, k in zip(regions, saved.get("decisions", ())):
                r.decision = k
            return
        with watching_time_cuts() as cuts:
            built(units, regions)
        if not cuts and "short" not in state:
            chosen = [
                None if u.optimized is u.function else (u.optimized, list(u.lifted)) for u in units
            ]
            lifting = any(u.lifted for u in units)
            with _JOINT_LOCK:
                if len(_JOINT) > 64:
                    _JOINT.clear()
                _JOINT[key] = (chosen, dict(state), trips if lifting else None)

    def built(units: list[Unit], regions: list[ControlRegion]) -> None:
        functions = [u.function for u in units]
        for u in units:
            u.optimized, u.lifted = u.function, []
        deadline = given
        if deadline is None:
            prepare_session(rules)  # before the clock starts (see prepare_session)
            deadline = Deadline(budget.seconds)
        with scratch_session(rules) as session:
            progs = [session.add_function(f, module) for f in functions]
            for u, prog in zip(units, progs):
                if u.loop is not None:  # tie the body to its scan (rules/loops.egg)
                    session.run_text(loop_facts(u.loop), "<loop facts>")
                    prog.outer_vars = dict(u.loop.outer)
                    prog.var_types.update(u.loop.outer)
            made = {id(u): prog.roots for u, prog in zip(units, progs)}

            def roots(u):
                return made[id(u)]

            if regions:  # conds, switches, one-step scans as terms (rules/loops.egg)
                session.run_text(region_facts(regions, roots), "<control regions>")
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
                return
            state["res"] = res
            for r in regions:
                r.decision = decided(session, r, roots)
            state["decisions"] = [r.decision for r in regions]
            state["control"] = [r.report() for r in regions if r.decision is not None]
            if rules:
                state["fired"] = user_rules_fired(session, res.saturation)
            candidates = [
                (
                    u,
                    new,
                    list(prog.lifted),
                    _candidate(u, new, prog.lifted, session, res, module, target),
                )
                for u, new, prog in zip(units, res.functions, progs)
            ]
        # the guard plans after the pop: inside the session each of its fusion e-graphs was a
        # push on top of this saturated one (egglog copies the database on a push, and the
        # fusion rules search all of it): LSTM T=8, 8 plans took 1.04 s of CPU against 0.2 s
        asked = [  # the programs the guard will plan (fusion_ahead.py: their rules at once)
            (f, module)
            for u, new, _, (keep, _, _, stable) in candidates
            if keep and guard is not None and new is not u.function and not stable
            for f in (u.function, new)
        ]
        with planning_ahead(asked):
            for u, new, lifted, (keep, before, after, stable) in candidates:
                u.optimized = _guarded(u.function, new, keep, stable, module, state, guard)
                costs = (before, after if u.optimized is new else before)
                state.setdefault("costs", []).append(costs)
                u.lifted = lifted if u.optimized is new else []

    new, units = optimize_with_bodies(fn, module, joint)
    new = apply_loop_rules(new)  # dead carries dropped, sums deferred (ir/loop_rules.py)
    new = hoist_branch_common(new)  # values every branch computes, before the branch
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
        + "".join(f"; {line}" for line in state.get("control", []))
        + (f"; time budget: {state['short']}" if "short" in state else ""),
    )
    if res is not None:
        fr.seconds = dict(res.seconds)
    fr.user_rules = state.get("fired", [])
    fr.never_slower = list(state.get("guard", []))
    return new, fr


# the straight units of a function with loops, as text (and the settings) -> what the one
# e-graph chose for each (None: kept as written, else (function, lifted)), its report's state,
# and the loops' lengths where a choice computes values before a loop (their types have the
# length in them), else None. A process cache: a second compile of the same pieces and bodies
# (dq.jit at another scan length, whose pieces around the loop are the same) builds no
# e-graph, unless the first choice lifted values out of a loop (then only the same lengths).
_JOINT: dict[tuple, tuple] = {}
_JOINT_LOCK = threading.Lock()


def _joint_key(functions, rules, target, budget, extractor, schedule, time_limit) -> tuple:
    texts = tuple(str(f) for f in functions)
    mine = tuple(read_rule_file(r)[0] for r in rules) if rules else ()
    profile = machine(target).cost_key
    return (texts, mine, target, repr(budget), extractor, repr(schedule), time_limit, profile)


def _candidate(unit, new, lifted, session, res, module, target) -> tuple:
    """(whether `new` replaces `old` before the guard is asked, old's cost, new's cost, the
    numerically stable rules that made it): `new` where it verifies and is cheaper than `old`
    (or as cheap in fewer instructions), or where a numerical-stability rewrite fired
    (stability outranks the cost model, egraph/stability.py, as for a function without loops).
    An ill-typed `new` that a user's rule made is the user's error."""
    old = unit.function
    before = program_cost(old, module, target)
    try:
        verify_function(new, module)
        after = program_cost(new, module, target)
        for x in lifted:  # computed once before the loop: a step pays 1/n of it
            verify_function(x.before, module)
            after += program_cost(x.before, module, target) / unit.loop.trips
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
    names = tuple(stable_rules_fired(res.saturation.rule_matches)) if stable else ()
    return keep, before, after, names


def _guarded(old, new, keep, stable, module, state, guard=None) -> Function:
    """`new` if `keep` and the guard (the planned programs compared) agrees, else `old`; a
    body that reads values lifted before its loop is planned without them (they cost 1/n of
    a step, priced by the cost model in _candidate)."""
    if keep and guard is not None and new is not old:
        choice = guard(old, new, module, stable)
        state.setdefault("guard", []).append(f"{old.name}: {choice}")
        keep = choice.kept == "optimized"
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
