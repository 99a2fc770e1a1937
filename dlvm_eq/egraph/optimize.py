"""The optimizer: IR -> e-graph -> budgeted saturation -> cost-based extraction -> IR.

    result = dq.optimize(module, target="cpu")          # every function with a body
    print(result.module)                                 # the optimized IR
    print(result.report)                                 # costs, stop reason, rules fired

Composable pieces, for drivers that build their own e-graph (e.g. adjoints: forward and
gradient roots in one e-graph, extracted jointly so that they share values):

    session = new_session()                              # schema + the shipped rule files
    fwd = session.add_function(fn, module)
    grad = dataclasses.replace(fwd, name="f_grad", roots=[...], result_is_tuple=True)
    res = optimize_session(session, [fwd, grad], target="cpu")
    res.functions                                        # [optimized f, optimized f_grad]
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DlvmError
from ..extract import Extraction, ExtractionError, extract
from ..extract.target_cost import TargetCost
from ..ir.control_flow import reaches_control_flow
from ..ir.declared import require_body
from ..ir.module import Function, Module
from ..ir.verifier import verify_function
from .attention_report import attention_lines
from .deadline import Deadline, extraction_seconds, nodes_within, observe
from .expr import render
from .layout_report import layout_lines
from .lets import Let
from .loader import LoadedProgram, load_function
from .optimize_report import FunctionReport, OptimizeReport, user_rules_fired
from .rule_origin import blame_user_rules, check_terms, user_rule_files
from .rulefiles import read_rule_file, rule_file
from .ruleset_schedule import Budget, Schedule, rulesets_in
from .saturate import SaturationReport, node_count, saturate
from .scratch_rules import compile_seconds
from .serialized import Graph, class_types
from .session import EGraphSession
from .stability import stable_rules_fired
from .unload import unload

# The shipped rule files every compile stage uses, compiled into one session per thread: the
# optimizer runs `algebra`'s rulesets, the adjoint driver `adjoint`, the fusion stage `fusion`,
# each on its own program between (push) and (pop). Every rule names its ruleset, so rules of
# one stage never run in another.
STAGE_RULE_FILES = ("algebra.egg", "adjoint.egg", "fusion.egg")
# issue 33: attention.egg (`attention`, run by the optimizer; needs algebra's cval) and the fused
# op's adjoints (ruleset `adjoint`, declared by adjoint.egg)
STAGE_RULE_FILES += ("attention.egg", "attention_adjoint.egg")
# issue 30: rules/loops.egg (`loops`, run by the optimizer): selectors folded to constants
STAGE_RULE_FILES += ("loops.egg",)
# issue 36: layout rules (rulesets `transpose` and `layout`, declared by algebra.egg)
STAGE_RULE_FILES += ("layout.egg",)
# issue 31: per-example gradients' norms and batch sums without storing them (`perexample`)
STAGE_RULE_FILES += ("per_example.egg",)
# issue 33: x^T [dQ|dK|dV] (`merge-adjoint`, run by the adjoint's schedule; its weight-adjoint
# facts are noted while the adjoint expands, so it lives in the adjoint's session)
STAGE_RULE_FILES += ("merge_adjoint.egg",)
# issue 32: the fusion stage's programs live in a session of their own, the schema and
# fusion.egg only: an egglog (push) copies the whole e-graph with every rule compiled into it
# (21-25 ms a push/pop pair with the files above, 2-4 ms with the schema alone)
FUSION_RULE_FILES = ("fusion.egg",)


def new_session(
    rules: Sequence[str | Path] = (),
    shipped: Sequence[str] = STAGE_RULE_FILES,
    prune: bool = False,
):
    """A session with the schema, the `shipped` rule files (names in rules/) and the user's
    rule files loaded. prune: the shipped rules are compiled only once a program between
    (push) and (pop) can fire them (egraph/scratch_rules.py); with a user's file, all are."""
    session = EGraphSession(prune=prune)
    for name in shipped:
        session.add_rules_file(rule_file(name))
    for path in rules:
        session.add_rules_file(path)
    return session


# egglog's EGraph belongs to the thread that made it (pyo3 `unsendable`): one pool per thread
_LOCAL = threading.local()
# base sessions kept per thread: the shipped rules, the fusion stage's, and user rule sets
POOL_SIZE = 5
# issue 32: pooled sessions compile the rules each program can fire, as programs come (False:
# all ~550 at once, ~0.5 ms each; the tests compare the two)
PRUNE_RULES = True


def _bases() -> dict[tuple, EGraphSession]:
    bases = getattr(_LOCAL, "bases", None)
    if bases is None:
        bases = _LOCAL.bases = {}
    return bases


def _base_session(
    rules: Sequence[str | Path], shipped: Sequence[str] = STAGE_RULE_FILES
) -> tuple[tuple, EGraphSession]:
    """(key, this thread's session with the `shipped` rule files and `rules` compiled), made on
    first use. A user's rule files get a base session of their own, keyed by their contents:
    their rules never reach a compile that did not ask for them."""
    key: tuple = tuple(read_rule_file(p) for p in rules)  # (text, file) per user rule file
    if tuple(shipped) != STAGE_RULE_FILES:  # the fusion session's: its file names lead the key
        key = (" ".join(shipped), *key)
    bases = _bases()
    session = bases.get(key)
    if session is None:
        if len(bases) >= POOL_SIZE:  # drop user rule sets, oldest first; keep the shipped
            user = [k for k in bases if any(isinstance(x, tuple) for x in k)]
            for old in user[: len(bases) - POOL_SIZE + 1]:
                del bases[old]
        t0 = time.perf_counter()
        session = bases[key] = new_session(rules, shipped, prune=PRUNE_RULES)
        _LOCAL.rule_seconds = getattr(_LOCAL, "rule_seconds", 0.0) + time.perf_counter() - t0
    return key, session


def rule_compile_seconds() -> float:
    """Seconds this thread spent compiling rule files into its base sessions (the compile
    report's `rules` phase)."""
    return getattr(_LOCAL, "rule_seconds", 0.0) + compile_seconds()


def prepare_session(rules: Sequence[str | Path] = ()) -> None:
    """Compile `rules` into this thread's reusable session now, before a time budget starts.
    Compiling them is no part of what a budget bounds (saturation, extraction): about a second
    in a fresh process, several on a busy machine, and counted against the budget it stopped a
    fresh process's saturation early, so that it compiled another program than a warm one."""
    _base_session(rules)


@contextmanager
def scratch_session(
    rules: Sequence[str | Path] = (),
    rulesets: Sequence[str] | None = None,
    shipped: Sequence[str] = STAGE_RULE_FILES,
):
    """This thread's session with the `shipped` rule files and `rules` loaded; the program
    lives between an egglog (push) and (pop), so the rules are compiled once per thread (those
    the program can fire, where pruned). rulesets: the only ones the program runs, if known.
    shipped: FUSION_RULE_FILES for the fusion stage, whose pushes then copy only its rules."""
    key, session = _base_session(rules, shipped)
    depth = len(session.values.marks)
    session.push(rulesets)
    try:
        yield session
    except BaseException:
        _restore(key, session, depth)
        raise
    session.run_text("(pop)")


def _restore(key: tuple, session: EGraphSession, depth: int) -> None:
    """After an error inside a scratch session (an adjoint without a rule, a short budget):
    pop back to the base state, which egglog's (pop) restores whatever happened since the
    push; a session that egglog failed inside (a panic), or that does not pop, is dropped."""
    try:
        if session.broken:
            raise DlvmError("broken")
        while len(session.values.marks) > depth:
            session.run_text("(pop)")
    except BaseException:
        _bases().pop(key, None)


def schedule_for(rules: Sequence[str | Path] = ()) -> Schedule:
    """The default schedule plus the rulesets the user's files declare."""
    # rules/attention.egg, rules/loops.egg, rules/per_example.egg
    schedule = Schedule.default().with_rulesets(("attention", "loops", "perexample"))
    for path in rules:
        schedule = schedule.with_rulesets(rulesets_in(read_rule_file(path)[0]))
    return schedule


@dataclass
class Extracted:
    """Functions unloaded from one joint extraction of several programs' roots."""

    functions: list[Function]
    extraction: Extraction
    graph: Graph
    cost: TargetCost
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what a short time budget gave up


@dataclass
class SessionResult(Extracted):
    saturation: SaturationReport | None = None


class ShortOfTime(DlvmError):
    """No extraction fitted in what the time budget left (the caller keeps the program as written)."""


ILP_MIN_SECONDS = 0.2  # below this much time left, the ILP is not worth starting: greedy


def extract_programs(
    session: EGraphSession,
    programs: Sequence[LoadedProgram],
    target="cpu",
    extractor: str = "greedy",
    time_limit: float = 10.0,
    unload_functions: bool = True,
    deadline: Deadline | None = None,
    nodes: int | None = None,
) -> Extracted:
    """Extract every program's roots jointly (shared values are paid once) and unload each.

    deadline: when time is short, the ILP gives way to greedy, and past the point where the
    whole e-graph can be extracted in time, only part of it is serialized (egglog's row cap);
    when that part holds no program, ShortOfTime. `Extracted.notes` says what was given up."""
    t0 = time.perf_counter()
    notes: list[str] = []
    max_rows = None
    if deadline is not None:
        nodes = node_count(session) if nodes is None else nodes
        left, need = deadline.left(), extraction_seconds(nodes)
        if need > left:
            # a cap per constructor also caps the analysis rows (shape, dtype) at as many, which
            # uncapped are about a third as many: half the e-nodes the time allows
            max_rows = max(100, nodes_within(left) // 2)
            notes.append(
                f"time budget short: serialized at most {max_rows} e-nodes per constructor "
                f"of {nodes}"
            )
        if extractor == "ilp" and left - need < ILP_MIN_SECONDS:
            extractor = "greedy"
            notes.append("time budget short: greedy extraction instead of ilp")
        # what extraction's own searches (greedy's local search, the ILP) may use
        time_limit = max(0.01, min(time_limit, left - need - 0.05))
    roots = [r for p in programs for r in p.roots]
    g = session.serialize(roots, terms_only=True, max_rows=max_rows)
    var_types, literals = {}, {}
    for p in programs:
        var_types.update(p.var_types)
        literals.update(p.literals)
    types = class_types(g, var_types, literals)
    if user_rule_files(session):  # not checked in CI: no e-node of theirs goes unchecked
        if max_rows is not None:
            raise ShortOfTime("no time left to type-check the whole e-graph your rules built")
        check_terms(g, types, var_types, literals)
    cost = TargetCost(target, types)
    t1 = time.perf_counter()
    try:
        ex = extract(
            g.data,
            roots=list(dict.fromkeys(g.roots)),
            method=extractor,
            cost=cost,
            time_limit=time_limit,
        )
    except ExtractionError as e:
        if max_rows is not None:
            raise ShortOfTime(
                f"no time left to extract from the whole e-graph ({nodes} e-nodes), "
                "and its serialized part holds no program"
            ) from None
        raise DlvmError(
            f"cannot extract a program from the e-graph: {e} (a helper constructor "
            "such as Adjoint left unexpanded, or an ill-typed term)"
        ) from None
    t2 = time.perf_counter()
    functions, at = [], 0
    for p in programs:
        if unload_functions:
            functions.append(unload(g, ex.choice, p, g.roots[at : at + len(p.roots)], name=p.name))
        at += len(p.roots)
    t3 = time.perf_counter()
    if extractor == "greedy" and deadline is not None:
        observe(sum(1 for n in g.nodes if n.startswith("function-")), t3 - t0)
    out = Extracted(
        functions, ex, g, cost, {"serialize": t1 - t0, "extract": t2 - t1, "unload": t3 - t2}
    )
    out.notes = notes
    return out


# the layout encodings of a program as loaded always finish (one or two iterations); the
# budget only keeps the one driver's guarantee that saturation stops
LAYOUT_BUDGET = Budget(iterations=1_000, nodes=10_000_000, seconds=600.0)


def baseline_cost(session: EGraphSession, programs: Sequence[LoadedProgram], target="cpu") -> float:
    """The cost of the programs as loaded (call it before saturating): their own terms, with
    only the `layout` ruleset's encodings added (a transpose read by a matmul is a BLAS flag)."""
    if "layout" in session.rulesets:
        saturate(session, Schedule(("layout",)), LAYOUT_BUDGET, analysis=None)
    return extract_programs(session, programs, target, unload_functions=False).extraction.dag_cost


def optimize_session(
    session: EGraphSession,
    programs: Sequence[LoadedProgram],
    *,
    schedule: Schedule | None = None,
    budget=None,
    target="cpu",
    extractor: str = "greedy",
    time_limit: float = 10.0,
    deadline: Deadline | None = None,
) -> SessionResult:
    """Saturate the session's e-graph under `budget`, extract all programs' roots jointly for
    `target`, and unload one Function per program (named `program.name`). The budget's seconds
    (or `deadline`) cover saturation and extraction together: saturation stops while the
    e-graph it leaves can still be extracted in time."""
    budget = Budget.of(budget)
    deadline = deadline or Deadline(budget.seconds)
    sat = saturate(session, schedule, budget, deadline=deadline, reserve=extraction_seconds)
    try:
        ex = extract_programs(
            session, programs, target, extractor, time_limit, deadline=deadline, nodes=sat.nodes
        )
    except ShortOfTime:
        raise
    except DlvmError as e:  # an ill-typed term: name the user's rules that fired, if any
        raise blame_user_rules(e, session, sat) from None
    seconds = {"saturate": sat.seconds, **ex.seconds}
    return SessionResult(
        ex.functions, ex.extraction, ex.graph, ex.cost, seconds, ex.notes, saturation=sat
    )


def program_cost(fn: Function, module: Module | None = None, target="cpu") -> float:
    """The cost model's estimate (seconds) of an IR function as written: the DAG cost of its
    e-graph terms, where a transpose read only by matmuls is a BLAS flag (as in `layout`)."""
    return loaded_cost(load_function(fn, module, prefix="c_"), target)


def _untransposed(let: Let) -> Let | None:
    """x for a let `(Transpose x (vec-of 1 0))`: what a matmul reads with a BLAS flag."""
    return let.args[0] if let.ctor == "Transpose" and let.args[1] == (1, 0) else None


def loaded_cost(prog: LoadedProgram, target="cpu") -> float:
    """program_cost of a loaded program, computed from its lets without an e-graph: the
    same value as extracting it after only the `layout` ruleset, at a fraction of the time."""
    model = TargetCost(target, {})
    named = prog.named()
    total, seen, stack = [], set(), [named[r] for r in prog.roots]
    while stack:
        let = stack.pop()
        if let in seen:
            continue
        seen.add(let)
        ctor, kids, flags = let.ctor, let.children, (False, False)
        if ctor == "Dot":
            plain = [_untransposed(k) for k in kids]
            if any(plain):
                flags = (plain[0] is not None, plain[1] is not None)
                kids = tuple(p or k for p, k in zip(plain, kids))
                ctor = "Gemm"
        if ctor == "Concatenate" and let.type is not None:  # priced as extraction prices it
            inner = kids[0]
            nested = inner.ctor == "Concatenate" and inner.args[-1] == let.args[-1]
            total.append(model.concatenation_seconds(let.type, inner.type if nested else None))
        else:
            perm = tuple(let.args[1]) if ctor == "Transpose" else None
            total.append(
                model.term_cost(ctor, let.type, lambda i, kids=kids: kids[i].type, flags, perm)
            )
        stack.extend(kids)
    return math.fsum(total)


@dataclass
class OptimizeResult:
    module: Module
    report: OptimizeReport

    @property
    def cost_before(self) -> float:
        return sum(f.cost_before for f in self.report)

    @property
    def cost_after(self) -> float:
        return sum(f.cost_after for f in self.report)

    def __str__(self) -> str:
        return str(self.report)


def optimize(
    module: Module,
    func: str | None = None,
    rules: Sequence[str | Path] | None = None,
    target: str = "cpu",
    budget=None,
    extractor: str = "greedy",
    schedule: Schedule | None = None,
    time_limit: float = 10.0,
    explain: bool = False,
    deadline: Deadline | None = None,
    guard=None,
) -> OptimizeResult:
    """Optimize every function of `module` (or only `func`) for `target` ("cpu" or "gpu").

    rules: extra rule files, loaded after rules/algebra.egg; their rulesets join the schedule.
    budget: a Budget, a dict such as {"nodes": 20000, "seconds": 2}, or None for the defaults.
    Its seconds bound the whole call (every function: saturation, serialization, extraction;
    each function gets an equal share of what is left); `deadline` (a Deadline) instead says
    when the call must be done, e.g. counted from when a command started.
    explain: also write each result as written and as extracted into the report (infix).
    A function is replaced only when the result is cheaper under the target's cost model.
    guard: `guard(old, new, module, stable)` -> a choice whose `.kept` is "optimized" or
    "original", asked about each program (a function, or a straight piece or body of one
    with loops) the e-graph would replace: the never-slower guard (pipeline/never_slower.py,
    what dq.optimize passes) compares the two planned programs.
    """
    rules = [rules] if isinstance(rules, (str, Path)) else list(rules or ())
    schedule = schedule or schedule_for(rules)
    budget = Budget.of(budget)
    if deadline is None:
        prepare_session(rules)  # before the clock starts (see prepare_session)
        deadline = Deadline(budget.seconds)
    names = [module[func].name] if func is not None else list(module.functions)
    out = Module(module.name, module.stage)
    report = OptimizeReport(str(target))
    # a loop body is optimized with the function that runs it (egraph/optimize_loops.py)
    from .optimize_loops import bodies_optimized_with, put_bodies

    with_loops = bodies_optimized_with(module, names)
    todo = sum(1 for n in module.functions if n in names and id(module[n]) not in with_loops)
    for name, fn in module.functions.items():
        if name in names and id(fn) not in with_loops:
            share = deadline.split(todo)
            todo -= 1
            optimize_one = _optimize_function
            if reaches_control_flow(fn, module):  # pieces and bodies in one e-graph
                from .optimize_loops import optimize_loops as optimize_one
            fn, fr = optimize_one(
                module,
                fn,
                rules,
                target,
                budget,
                extractor,
                schedule,
                time_limit,
                explain,
                share,
                guard=guard,
            )
            if fr is not None:
                report.functions[name] = fr
        out.add(fn)
    put_bodies(out, with_loops)
    return OptimizeResult(out, report)


RENDER_LIMIT = 60  # e-nodes written per result in an explanation; the rest is "..."


def _rendered(ex: Extracted) -> list[str]:
    g = ex.graph
    return [render(g, ex.extraction.choice, r, ex.cost.types, limit=RENDER_LIMIT) for r in g.roots]


def _optimize_function(
    module,
    fn,
    rules,
    target,
    budget,
    extractor,
    schedule,
    time_limit,
    explain=False,
    deadline: Deadline | None = None,
    guard=None,
):
    deadline = deadline or Deadline(budget.seconds)
    require_body(fn)  # declared adjoints: resolved by the pipeline (dq.optimize) first
    with scratch_session(rules) as session:
        t0 = time.perf_counter()
        prog = session.add_function(fn, module)
        t1 = time.perf_counter()
        before = loaded_cost(prog, target)
        t2 = time.perf_counter()
        # the program as written, rendered before saturation adds anything to its classes
        written = (
            _rendered(extract_programs(session, [prog], target, unload_functions=False))
            if explain
            else []
        )
        try:
            res = optimize_session(
                session,
                [prog],
                schedule=schedule,
                budget=budget,
                target=target,
                extractor=extractor,
                time_limit=time_limit,
                deadline=deadline,
            )
        except ShortOfTime as e:
            res = None
            short = str(e)
        fired = user_rules_fired(session, res.saturation) if rules and res is not None else []
    if res is None:
        fr = FunctionReport(
            fn.name,
            before,
            before,
            None,
            extractor,
            "skipped",
            0,
            len(fn.body),
            len(fn.body),
            kept_original=True,
            note=f"time budget ({budget.seconds:g} s): {short}",
        )
        fr.seconds = {"load": t1 - t0, "baseline": t2 - t1}
        return fn, fr
    new = res.functions[0]
    status = res.extraction.status + "".join(f"; {n}" for n in res.notes)
    used = res.extraction.method
    fr = FunctionReport(
        fn.name,
        before,
        before,
        res.saturation,
        used,
        status,
        sum(1 for c in res.graph.classes if res.graph.is_term_class(c)),
        len(fn.body),
        len(fn.body),
    )
    fr.seconds = {"load": t1 - t0, "baseline": t2 - t1, **res.seconds}
    fr.user_rules = fired
    fr.attention = attention_lines(res.extraction, res.cost)
    fr.layout = layout_lines(fn, new, res.saturation, target)  # issue 36
    if explain:
        fr.results = list(zip(written, _rendered(res)))
    t3 = time.perf_counter()
    try:
        verify_function(new, module)
        # the cost of the IR as unloaded (reductions merged, broadcasts implicit), not of the
        # extracted e-nodes: never-worse holds for the program the user gets
        after = program_cost(new, module, target)
        fr.seconds["recost"] = time.perf_counter() - t3
    except DlvmError as e:  # a user's rule, or a bug: keep the program correct
        blamed = blame_user_rules(e, session, res.saturation)
        if blamed is not e:
            raise blamed from None
        warnings.warn(
            f"optimize: @{fn.name}: the extracted program is invalid ({e}); kept the original"
        )
        fr.kept_original, fr.note = True, f"internal error: {e}"
    stable = stable_rules_fired(res.saturation.rule_matches) if res.saturation else []
    # the cost model prices a program's DAG (two equal instructions are one let, priced once),
    # so a program whose only gain is duplicates gone costs the same as the one written:
    # fewer instructions break the tie (as for a function with loops, optimize_loops._chosen)
    fewer = not fr.kept_original and after <= before and len(new.body) < len(fn.body)
    if not fr.kept_original and (after < before or stable or fewer):
        if after >= before and not fewer:  # stability outranks the cost model (stability.py)
            fr.note = (
                "kept although not cheaper: numerically stable forms (" + ", ".join(stable) + ")"
            )
        if guard is not None:  # the planned programs compared (pipeline/never_slower.py)
            choice = guard(fn, new, module, tuple(stable))
            if choice.kept != "optimized":
                fr.kept_original = True
                fr.note = f"{choice} (never_slower=False or --no-never-slower: the e-graph's)"
                return fn, fr
            fr.never_slower.append(str(choice))
        fr.cost_after, fr.ops_after = after, len(new.body)
        new.adjoint, new.location = fn.adjoint, fn.location
        return new, fr
    if not fr.kept_original:
        fr.kept_original, fr.note = True, "the extracted program is not cheaper"
    return fn, fr
