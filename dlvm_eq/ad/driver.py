"""The differentiator: reverse-mode adjoints accumulated over use lists, expanded into IR ops by
rules/adjoint.egg in the e-graph that holds the forward program, then extracted jointly.

    g = adjoint_function(module, module["f"], wrt=(0,), keeping=(0,))
    print(g)       # func @f_grad: (...) -> (<f's result>, <d f / d param 0>)

DLVM's conventions: the adjoint takes f's parameters (then one seed per differentiated output
when `seedable`) and returns the kept outputs first, then one gradient per `wrt` parameter.
Without `seedable` the seed is ones of the output's shape. `from` picks one output of a tuple;
without it every float output is differentiated (their seeds add up). A single result is returned
as itself rather than as a one-element tuple.
"""

from __future__ import annotations

import contextvars
import dataclasses
import re
import threading
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..cache import note_time_cut
from ..egraph.adjoint_report import AdjointReport
from ..egraph.attention_forward import with_fused_attention
from ..egraph.attention_guarded import has_batched_products, optimize_attention_guarded
from ..egraph.attention_plain import with_plain_attention
from ..egraph.deadline import Deadline
from ..egraph.lets import Let, LetTable, inline
from ..egraph.loader import LoadedProgram
from ..egraph.rulefiles import read_rule_file, rule_file, rules_digest
from ..egraph.ruleset_schedule import Budget, Schedule
from ..egraph.serialized import EGG_TO_OP, LEAVES, Graph
from ..errors import DlvmError
from ..extract.machine import machine
from ..ir.control_flow import reaches_control_flow
from ..ir.function_cache import cached_function
from ..ir.module import Function, Module, Value
from ..ir.ops import OPS
from ..ir.printer import print_function, print_module
from ..ir.registry.egraph_only import ADJOINT_HELPERS
from ..ir.types import TensorType, TupleType, Type
from ..ir.verifier import verify_function


class AdjointError(DlvmError):
    """An adjoint that cannot be built: a missing rule, or bad `wrt`/`from`/`keeping`."""


# The adjoint rules with the shape analysis saturated after each iteration (rules need the
# shapes of the terms that earlier rules built), by the one saturation driver. Expansion must
# finish (an unexpanded Adjoint is an error): the budget only guards against runaway rule files.
# A deep program may need many iterations: up to 64 per step (egglog call), from one doubling
# (saturate.py: egglog's `repeat` runs them all, so a shallow program must not ask for 64).
EXPANSION = Schedule(("adjoint",), step=64)
EXPANSION_BUDGET = Budget(iterations=100_000, nodes=10_000_000, seconds=600.0, work=10**15)
# the algebra saturated over forward and adjoint together (see _adjoint_function); with a
# guard, rules/attention.egg's ruleset too, behind it (egraph/attention_guarded.py)
ADJOINT_SCHEDULE = Schedule.default().with_rulesets(("loops", "perexample", "merge-adjoint"))
# Adjoint and its helpers (rules/adjoint.egg), declared in ir/registry/egraph_only.py
HELPERS = tuple(h for h in ADJOINT_HELPERS if h != "Adjoint")
_TERMS = set(EGG_TO_OP) | set(LEAVES)


@dataclass(frozen=True)
class AdjointConfig:
    """A normalized adjoint request (indices checked against the function)."""

    wrt: tuple[int, ...]  # parameters to differentiate with respect to
    outputs: tuple[int, ...]  # outputs differentiated (their seeds add up)
    keeping: tuple[int, ...]  # outputs also returned, first
    seedable: bool

    def describe(self, fn: Function) -> str:
        return (
            f"the adjoint of @{fn.name} from {', '.join(map(str, self.outputs))} "
            f"wrt {', '.join(map(str, self.wrt))}"
            + (f" keeping {', '.join(map(str, self.keeping))}" if self.keeping else "")
            + (" seedable" if self.seedable else "")
        )


def _outputs(fn: Function) -> list[TensorType]:
    t = fn.result_type
    return list(t.elements) if isinstance(t, TupleType) else [t]


def configure(
    fn: Function, wrt=None, from_index=None, keeping=None, seedable=False
) -> AdjointConfig:
    """Check `wrt`, `from`, `keeping` against fn; defaults: every float parameter and output."""
    outs = _outputs(fn)
    if wrt is None:
        wrt = tuple(
            i
            for i, p in enumerate(fn.params)
            if isinstance(p.type, TensorType) and p.type.dtype.is_float
        )
    wrt = tuple(int(i) for i in ([wrt] if isinstance(wrt, int) else wrt))
    for i in wrt:
        if not 0 <= i < len(fn.params):
            raise AdjointError(
                f"@{fn.name} has {len(fn.params)} parameters; wrt {i} is out of range"
            )
        t = fn.params[i].type
        if not (isinstance(t, TensorType) and t.dtype.is_float):
            raise AdjointError(
                f"@{fn.name}: parameter {i} (%{fn.params[i].name}: {t}) is not a "
                "float tensor; only float parameters can be differentiated"
            )
    if len(set(wrt)) != len(wrt):
        raise AdjointError(f"@{fn.name}: wrt {list(wrt)} repeats a parameter")
    if from_index is None:  # every float output (a bool or int output has no adjoint)
        outputs = tuple(i for i, t in enumerate(outs) if t.dtype.is_float)
        if not outputs:
            raise AdjointError(f"@{fn.name} has no float output to differentiate")
    else:
        if not 0 <= from_index < len(outs):
            raise AdjointError(
                f"@{fn.name} has {len(outs)} output{'s' * (len(outs) != 1)}; "
                f"from {from_index} is out of range"
            )
        outputs = (int(from_index),)
    for i in outputs:
        if not outs[i].dtype.is_float:
            raise AdjointError(
                f"@{fn.name}: output {i} ({outs[i]}) is not a float tensor and "
                "cannot be differentiated"
            )
    keeping = tuple(int(i) for i in (keeping or ()))
    if len(set(keeping)) != len(keeping):
        raise AdjointError(f"@{fn.name}: keeping {list(keeping)} repeats an output")
    for i in keeping:
        if not 0 <= i < len(outs):
            raise AdjointError(
                f"@{fn.name} has {len(outs)} output{'s' * (len(outs) != 1)}; "
                f"keeping {i} is out of range"
            )
    return AdjointConfig(wrt, outputs, keeping, bool(seedable))


def adjoint_signature(fn: Function, cfg: AdjointConfig) -> tuple[list[Type], list[TensorType]]:
    """(parameter types, result types) of the adjoint function."""
    outs = _outputs(fn)
    params = list(fn.param_types) + ([outs[i] for i in cfg.outputs] if cfg.seedable else [])
    results = [outs[i] for i in cfg.keeping] + [fn.params[i].type for i in cfg.wrt]
    return params, results


# ---------------------------------------------------------------- the reverse pass


class _ReversePass:
    """Builds the adjoint lets: adj(v) = sum over the uses (i, u) of v of (Adjoint i u adj(u))."""

    def __init__(self, prog: LoadedProgram, fn: Function, cfg: AdjointConfig):
        self.prog, self.fn, self.cfg = prog, fn, cfg
        self.table = LetTable("adj", intern=False)  # each use its own Adjoint term
        self.adjoints: list[Let] = []  # every (Adjoint i u g) built
        var_lets = {let.args[0]: let for let in prog.lets if let.ctor == "Var"}
        self.param_lets = [var_lets[p.name] for p in fn.params]

    @property
    def lets(self) -> list[Let]:
        return self.table.lets

    def let(self, ctor: str, args: tuple, t: TensorType | None = None) -> Let:
        return self.table.let(ctor, args, t)

    def constant(self, value: float, t: TensorType) -> Let:
        const = ("Const", (float(value), str(t.dtype)))
        return (
            self.let("Broadcast", (inline(*const), t.shape), t) if t.shape else self.let(*const, t)
        )

    def seed_param(self, t: TensorType, index: int, count: int) -> Let:
        taken = {p.name for p in self.prog.params}
        base = "seed" if count == 1 else f"seed{index}"
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        self.prog.params.append(Value(name, t))
        self.prog.var_types[name] = t
        return self.let("Var", (name,), t)  # with its shape and dtype, as a parameter's

    def active(self) -> set[Let]:
        """Float values that depend on a wrt parameter: the only ones that get adjoints."""
        live = {self.param_lets[i] for i in self.cfg.wrt}
        for let in self.prog.lets:
            if let not in live and let.type.dtype.is_float and any(c in live for c in let.children):
                live.add(let)
        return live

    def run(self) -> list[str]:
        """The root lets' names: kept outputs, then gradients."""
        prog, cfg = self.prog, self.cfg
        named = prog.named()
        out_types = _outputs(self.fn)
        pending: dict[Let, list[Let]] = defaultdict(list)
        for k, i in enumerate(cfg.outputs):
            t = out_types[i]
            seed = self.seed_param(t, k, len(cfg.outputs)) if cfg.seedable else None
            pending[named[prog.roots[i]]].append(seed or self.constant(1.0, t))
        live = self.active()
        adjoint: dict[Let, Let] = {}
        for let in reversed(prog.lets):
            parts = pending.pop(let, None)
            if not parts or let not in live:
                continue
            g = parts[0]
            for part in parts[1:]:
                g = self.let("Add", (g, part))
            adjoint[let] = g
            spec = OPS[EGG_TO_OP[let.ctor]] if let.ctor in EGG_TO_OP else None
            if let.ctor == "AttentionBackward":  # a fused adjoint has no adjoint rules (issue 33)
                raise AdjointError(
                    f"@{self.fn.name}: cannot differentiate a fused attention backward "
                    "(attentionBackward); differentiate the program before optimizing it"
                )
            if spec is None or not spec.differentiable:
                continue
            for i, child in enumerate(let.children):
                if child in live and i not in spec.nondiff_operands:
                    term = self.let("Adjoint", (i, let, g))
                    pending[child].append(term)
                    self.adjoints.append(term)
        roots = [prog.roots[i] for i in cfg.keeping]
        for i in cfg.wrt:
            g = adjoint.get(self.param_lets[i]) or self.constant(0.0, self.fn.params[i].type)
            roots.append(g.name)
        return roots


# ---------------------------------------------------------------- checks


def _check_expanded(g: Graph, rules_name: str, rules_text: str) -> None:
    """Every Adjoint (and helper) must share its e-class with an IR op after saturation."""
    missing: dict[tuple[str, int], None] = {}
    stuck: dict[str, None] = {}
    for nid, node in g.nodes.items():
        op = node["op"]
        if op != "Adjoint" and op not in HELPERS:
            continue
        if any(g.nodes[m]["op"] in _TERMS for m in g.classes.get(node["eclass"], [])):
            continue
        if op == "Adjoint":
            i = int(g.primitive(node["children"][0]))
            user = g.nodes[node["children"][1]]["op"]
            missing[(user, i)] = None
        else:
            stuck[op] = None
    if missing:
        no_rule, no_match = [], []
        for user, i in missing:
            ir = EGG_TO_OP.get(user)
            what = f"operand {i} of `{ir}` ({user})" if ir else f"operand {i} of {user}"
            has_rule = re.search(rf"\(Adjoint\s+{i}\s+\({user}\s", rules_text)
            (no_match if has_rule else no_rule).append(what)
        if no_rule:
            raise AdjointError(
                f"no adjoint rule in {rules_name} for "
                + "; ".join(no_rule)
                + " (expected a rule rewriting (Adjoint i (Op ...) g))"
            )
        raise AdjointError(
            f"the adjoint rule in {rules_name} for "
            + "; ".join(no_match)
            + " did not apply: a shape or dtype it needs is unknown"
            + _unshaped_ops(g)
        )
    if stuck:
        raise AdjointError(
            f"{rules_name}: helper(s) {', '.join(stuck)} left unexpanded "
            "(a shape or dtype they need is unknown)" + _unshaped_ops(g)
        )


def _unshaped_ops(g: Graph) -> str:
    """Where the shape analysis stopped: the ops whose operands have shapes but that have none
    themselves. An adjoint rule fails far downstream of them (at a reduce, say), so name them."""
    shapes: dict[str, tuple] = {}
    for node in g.nodes.values():
        if node["op"] == "shape":
            vec = next(
                (n for n in g.classes.get(node["eclass"], []) if g.nodes[n]["op"] == "vec-of"), None
            )
            shapes[g.eclass(node["children"][0])] = g.primitive(vec) if vec else ()
    culprits: dict[str, None] = {}
    for node in g.nodes.values():
        user = node["op"]
        if user not in EGG_TO_OP or node["eclass"] in shapes:
            continue
        operands = [g.eclass(c) for c in node["children"] if g.is_term_class(g.eclass(c))]
        if all(c in shapes for c in operands):
            given = ", ".join("x".join(map(str, shapes[c])) or "scalar" for c in operands)
            culprits[f"`{EGG_TO_OP[user]}` ({user}) of operand shapes {given}"] = None
    if not culprits:
        return ""
    return "; the shape analysis (rules/schema.egg) gives no shape to " + "; ".join(culprits)


# ---------------------------------------------------------------- what the e-graph did

_REPORT_RECORDERS: contextvars.ContextVar[tuple[list, ...]] = contextvars.ContextVar(
    "dlvm_eq_adjoint_reports", default=()
)


@contextmanager
def adjoint_reports():
    """Yields a list that receives an AdjointReport for each adjoint `adjoint_function` returns
    inside the block (this thread or task only), innermost first: what its e-graph did, or
    that it was read from the compile cache. A jit's report shows them (issue 32)."""
    reports: list[AdjointReport] = []
    token = _REPORT_RECORDERS.set(_REPORT_RECORDERS.get() + (reports,))
    try:
        yield reports
    finally:
        _REPORT_RECORDERS.reset(token)


def _publish(report: AdjointReport) -> None:
    for reports in _REPORT_RECORDERS.get():
        reports.append(report)


def _report_of(res, fn: Function, name: str, note: str = "") -> AdjointReport:
    """The AdjointReport of an optimize_session result (SessionResult) for `fn`'s adjoint."""
    from ..egraph.attention_report import attention_lines

    g = res.graph
    report = AdjointReport(
        name,
        fn.name,
        res.saturation,
        sum(1 for c in g.classes if g.is_term_class(c)),
        res.extraction.dag_cost,
        res.extraction.method,
        res.extraction.status + "".join(f"; {n}" for n in res.notes),
        attention_lines(res.extraction, res.cost),
        dict(res.seconds),
    )
    report.note = note
    return report


# ---------------------------------------------------------------- the entry points


@contextmanager
def _session(rules):
    """(session, rules text, rules file name): an e-graph with the schema, rules/algebra.egg and
    the adjoint rules. The shipped rules share one compiled session (push/pop per use)."""
    # egglog loads here, not on import: a warm-cache compile reads adjoints from disk
    from ..egraph import load_bindings

    load_bindings()
    from ..egraph.optimize import new_session, scratch_session

    if rules is None:  # adjoint.egg is one of the rule files of this thread's shared session
        with scratch_session(
            rulesets=("analysis", *EXPANSION.rulesets, *ADJOINT_SCHEDULE.rulesets)
        ) as session:
            text, name = read_rule_file(rule_file("adjoint.egg"))
            # issue 33: the fused attention's adjoints, in the same session (STAGE_RULE_FILES)
            text += "\n" + read_rule_file(rule_file("attention_adjoint.egg"))[0]
            yield session, text, name
        return
    if isinstance(rules, Path) or (
        isinstance(rules, str) and "\n" not in rules and rules.endswith(".egg")
    ):
        text, name = read_rule_file(rules)
    else:
        text, name = str(rules), "<adjoint rules>"
    session = new_session(shipped=("algebra.egg",))  # the user's text declares `adjoint`
    session.add_rules_text(text, name)
    yield session, text, name


def adjoint_function(
    module: Module | None,
    fn: Function,
    wrt=None,
    from_index=None,
    keeping=None,
    seedable: bool = False,
    name: str | None = None,
    *,
    rules=None,
    tuple_result: bool | None = None,
    optimize: bool = True,
    target: str = "cpu",
    budget=None,
    guard=None,
) -> Function:
    """The adjoint of `fn` as an IR Function (see the module docstring for its signature).

    rules: adjoint rules (a path or the text) instead of rules/adjoint.egg. tuple_result: a
    tuple even for one result (None: only for several). optimize: saturate the algebra rules
    over forward and adjoint together (under `budget`) before extracting for `target`.
    guard: the never-slower guard (pipeline/never_slower.guard_for), behind which the
    attention rules also run in that e-graph (egraph/attention_guarded.py); None: they do not."""
    if fn.is_declaration:
        fn = synthesize_declared(module, fn)
    cfg = configure(fn, wrt, from_index, keeping, seedable)
    name = name or f"{fn.name}_grad"
    if reaches_control_flow(fn, module):  # cut at its loops and branches (control_flow.py)
        from .control_flow import control_flow_adjoint

        options = {"rules": rules, "optimize": optimize, "target": target, "budget": budget}
        # (a loop's adjoint: the guard is not passed on, its pieces keep the module's pass)
        return control_flow_adjoint(module, fn, cfg, name, tuple_result, options)

    built: list[AdjointReport] = []  # what build's e-graph did (none: read from the cache)

    def build() -> Function:
        from .resolve import resolve_declared  # (resolve.py imports this module)

        # declared adjoints that fn applies get their bodies before the e-graph loads fn
        applied = [i.attrs["callee"] for i in fn.body if i.op == "apply"]
        body_module = resolve_declared(module, applied) if applied else module
        # issue 33: a fused attention backward has no adjoint: second order runs the plain program
        forward = with_plain_attention(fn, body_module)
        if rules is None and optimize and forward is fn:  # the fused attention, as one op
            forward = with_fused_attention(body_module, fn, target, budget, cfg.wrt)
        return _adjoint_function(
            body_module,
            forward,
            cfg,
            name,
            rules,
            tuple_result,
            optimize,
            target,
            budget,
            built,
            guard,
        )

    if rules is not None:  # a user's rule file: not covered by the cache key
        out = build()
    else:
        # a second process differentiating the same program reads the result from disk
        # extraction (after optimizing or not) prices the e-graph with this host's profile:
        # another profile, another entry
        parts = [
            print_function(fn),
            print_module(module) if module is not None else "",
            repr((cfg, name, tuple_result, optimize, target, budget, guard is not None)),
            machine(target).cost_key,
        ]
        out = cached_function("adjoint", parts, build, rules_digest())
    _publish(built[-1] if built else AdjointReport(name, fn.name, from_cache=True))
    out.location = fn.location
    return out


def _adjoint_function(
    module, fn, cfg, name, rules, tuple_result, optimize, target, budget, reports: list, guard
) -> Function:
    from ..egraph import load_bindings

    load_bindings()
    from ..egraph.optimize import ShortOfTime, extract_programs, optimize_session
    from ..egraph.saturate import saturate

    with _session(rules) as (session, text, rules_name):
        # the budget's seconds bound the rest of the call: what the expansion takes, optimizing
        # has not; compiling the rules into the session (above) is not counted (see
        # egraph.optimize.prepare_session: a fresh, busy process would optimize less)
        deadline = Deadline(Budget.of(budget).seconds)
        prog = session.add_function(fn, module)
        prog.params = list(prog.params)
        prog.var_types = dict(prog.var_types)
        rev = _ReversePass(prog, fn, cfg)
        roots = rev.run()
        session.add_lets(rev.lets, f"<adjoint of @{fn.name}>")
        sat = saturate(session, EXPANSION, EXPANSION_BUDGET)
        if not sat.saturated:
            raise AdjointError(
                f"expanding the adjoint of @{fn.name} with {rules_name} stopped: {sat}"
            )
        _check_expanded(session.serialize(roots), rules_name, text)
        # An Adjoint is a function of its user's syntax, not of its value: once expanded it
        # must go, or congruence after algebra rewrites would merge unrelated adjoints.
        session.delete(rev.adjoints)
        grad = dataclasses.replace(
            prog,
            name=name,
            roots=roots,
            result_is_tuple=(len(roots) > 1 if tuple_result is None else tuple_result),
        )
        out = None
        if optimize:
            try:
                # dq.optimize's schedule (loops, perexample too): under jit the module's own
                # pass is then skipped (issue 32). `attention` only behind the guard: unguarded in
                # the joint e-graph, its flash row term made the transformer step's plan 28
                # kernels, not 26, which the module's pass had refused (never slower)
                schedule = ADJOINT_SCHEDULE if rules is None else None
                kwargs = {"budget": budget, "target": target, "deadline": deadline}
                note = ""
                if schedule is not None and guard is not None and has_batched_products(fn):
                    res, note = optimize_attention_guarded(
                        session, grad, schedule, guard, module, **kwargs
                    )
                else:
                    res = optimize_session(session, [grad], schedule=schedule, **kwargs)
                out = res.functions[0]
                reports.append(_report_of(res, fn, name, note))
            except ShortOfTime:  # the budget ran out: the gradient must still come out whole
                note_time_cut("adjoint: no time left to extract the optimized gradient")
                note = "time budget short: the gradient extracted as expanded, not optimized"
                reports.append(AdjointReport(name, fn.name, note=note))
        if out is None:
            out = extract_programs(session, [grad], target).functions[0]
            if not reports:
                reports.append(AdjointReport(name, fn.name, note="not optimized (optimize=False)"))
    verify_function(out)
    return out


_SYNTHESIZED: dict[int, tuple[Function, Function, int, Function]] = {}
_LOCAL = threading.local()  # per thread: the declarations being synthesized (cycle check)


def _in_progress() -> set[str]:
    names = getattr(_LOCAL, "in_progress", None)
    if names is None:
        names = _LOCAL.in_progress = set()
    return names


def _signature(params, results, as_tuple: bool) -> str:
    r = ", ".join(map(str, results))
    r = r if len(results) == 1 and not as_tuple else f"({r})"
    return f"({', '.join(map(str, params))}) -> {r}"


def synthesize_declared(module: Module, decl_fn: Function) -> Function:
    """The body of a bodiless `[adjoint @f ...]` function: a new Function with its name and
    declaration. Its declared signature must match the synthesized one."""
    decl = decl_fn.adjoint
    if decl is None:
        raise AdjointError(f"@{decl_fn.name} has no body and no [adjoint] declaration")
    if module is None:
        raise AdjointError(f"@{decl_fn.name}: synthesizing an adjoint needs its module")
    source = of = module[decl.of]
    hit = _SYNTHESIZED.get(id(decl_fn))
    if hit and hit[0] is decl_fn and hit[1] is source and hit[2] == len(source.body):
        return hit[3]
    if of.is_declaration:  # an adjoint of a declared adjoint: synthesize that first
        in_progress = _in_progress()
        if decl_fn.name in in_progress:
            raise AdjointError(f"@{decl_fn.name}: adjoint declarations form a cycle")
        in_progress.add(decl_fn.name)
        try:
            of = synthesize_declared(module, of)
        finally:
            in_progress.discard(decl_fn.name)
    cfg = configure(of, decl.wrt, decl.from_index, decl.keeping, decl.seedable)
    params, results = adjoint_signature(of, cfg)
    declared = decl_fn.result_type
    as_tuple = isinstance(declared, TupleType)
    want = list(declared.elements) if as_tuple else [declared]
    if list(decl_fn.param_types) != params or want != results:
        declared_sig = _signature(decl_fn.param_types, want, as_tuple)
        raise AdjointError(
            f"@{decl_fn.name} is declared {declared_sig} but {cfg.describe(of)} "
            f"has type {_signature(params, results, False)}"
        )
    out = adjoint_function(
        module,
        of,
        decl.wrt,
        decl.from_index,
        decl.keeping,
        decl.seedable,
        name=decl_fn.name,
        tuple_result=as_tuple,
    )
    out.adjoint = decl
    if len(_SYNTHESIZED) > 256:
        _SYNTHESIZED.clear()
    _SYNTHESIZED[id(decl_fn)] = (decl_fn, source, len(source.body), out)
    return out
