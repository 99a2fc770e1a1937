"""`dlvm-eq query`: the cheapest form of an expression, and the next-best alternatives.

    r = query("A @ B @ C", {"A": (30, 35), "B": (35, 15), "C": (15, 5)})
    print(r)            # best form, its cost and multiply count; then alternatives

Alternatives are one per e-node of the root e-class: that node at the top, greedy's choice
below it, all from one greedy pass (extract/alternatives.py). They differ in their outermost
step (e.g. where a chain splits last). `alternatives=0` computes none.

An expression is measured before it is read: one nested deeper than MAX_DEPTH is refused (the
reader, the IR builder and the renderer recurse per level), and so is a number that is not
finite in the query's dtype (`1e999`, or `1e39` in f32: the form would be printed as inf).
"""

from __future__ import annotations

import ast
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DlvmError
from ..extract.alternatives import alternatives as root_alternatives
from ..extract.cost_model import node_costs
from ..ir.module import Const, Function
from ..ir.op_spec import MATMUL_COST
from ..ir.ops import OPS
from ..ir.registry import EGRAPH_ONLY, read_types
from .deadline import Deadline, extraction_seconds, extraction_work
from .expr import ExpressionError, parse_expression, render
from .optimize import ShortOfTime, extract_programs, program_cost, schedule_for, scratch_session
from .optimize_report import seconds_text
from .rule_origin import blame_user_rules
from .ruleset_schedule import Budget, Schedule
from .saturate import SaturationReport, saturate


@dataclass
class Form:
    text: str  # infix form
    cost: float  # estimated seconds on the target
    multiplies: int  # multiply-adds in matmuls


@dataclass
class QueryResult:
    expression: str
    original: Form
    best: Form
    alternatives: list[Form] = field(default_factory=list)
    saturation: SaturationReport | None = None
    target: str = "cpu"

    def __str__(self) -> str:
        def line(label, f: Form):
            mm = f"  {f.multiplies:,} multiplies" if f.multiplies else ""
            return f"{label:<8}{f.text}\n{'':8}cost {seconds_text(f.cost)}{mm}"

        out = [line("input:", self.original), line("best:", self.best)]
        if self.alternatives:
            out.append("next best:")
            out.extend(line(f"  {i}.", f) for i, f in enumerate(self.alternatives, 2))
        if self.saturation is not None:
            out.append(str(self.saturation).splitlines()[0])
        return "\n".join(out)


def query(
    expression: str,
    shapes: dict[str, tuple[int, ...]],
    dtype: str = "f32",
    target: str = "cpu",
    rules: Sequence[str | Path] = (),
    budget=None,
    alternatives: int = 4,
    schedule: Schedule | None = None,
    deadline: Deadline | None = None,
) -> QueryResult:
    """The cheapest form of `expression` and up to `alternatives` next-best ones (each with
    another e-node at the top). The budget's seconds (or `deadline`) bound the whole query."""
    budget = Budget.of(budget)
    deadline = deadline or Deadline(budget.seconds)
    fn = read_expression(expression, shapes, dtype)
    original_cost = program_cost(fn, None, target)
    with scratch_session(rules) as session:  # the input as written, for comparison
        orig = extract_programs(session, [session.add_function(fn)], target)
    og = orig.graph
    original = Form(
        render(og, orig.extraction.choice, og.roots[0], orig.cost.types),
        original_cost,
        _multiplies(og, orig.extraction.choice, og.roots[0], orig.cost.types),
    )
    with scratch_session(rules) as session:
        prog = session.add_function(fn)
        sat = saturate(
            session,
            schedule or schedule_for(rules),
            budget,
            deadline=deadline,
            reserve=extraction_seconds,
            reserve_work=extraction_work,
        )
        try:
            ex = extract_programs(session, [prog], target, deadline=deadline, nodes=sat.nodes)
        except ShortOfTime:
            return QueryResult(expression, original, original, [], sat, target)
        except DlvmError as e:  # an ill-typed term: name the user's rules that fired, if any
            raise blame_user_rules(e, session, sat) from None
    g, cost = ex.graph, ex.cost
    types = cost.types
    root = g.roots[0]
    best_choice = ex.extraction.choice
    best = Form(
        render(g, best_choice, root, types),
        ex.extraction.dag_cost,
        _multiplies(g, best_choice, root, types),
    )
    alts: list[Form] = []
    if alternatives > 0:
        sg = ex.extraction.graph
        seen = {best.text}
        for total, choice in root_alternatives(sg, node_costs(sg, cost), sg.class_index[root]):
            named = {sg.class_ids[c]: sg.node_ids[n] for c, n in enumerate(choice) if n >= 0}
            f = Form(render(g, named, root, types), total, _multiplies(g, named, root, types))
            if f.text not in seen:
                seen.add(f.text)
                alts.append(f)
                if len(alts) >= alternatives or deadline.expired:
                    break
    return QueryResult(expression, original, best, alts, sat, target)


# Python's parser refuses parentheses nested past 200; the reader, builder and renderer take one
# to three frames a level, well inside Python's 1,000-frame limit at this depth
MAX_DEPTH = 200


def read_expression(expression: str, shapes, dtype: str = "f32") -> Function:
    """parse_expression, after measuring the text's depth; then every number must be finite."""
    if nesting_depth(expression) > MAX_DEPTH:
        raise ExpressionError(
            f"the expression is nested more than {MAX_DEPTH} levels deep; at most "
            f"{MAX_DEPTH} are read "
            "(name a part with a variable and query it on its own)"
        )
    with warnings.catch_warnings():  # an overflowing literal is reported below, once
        warnings.simplefilter("ignore", RuntimeWarning)
        fn = parse_expression(expression, shapes, dtype)
    for inst in fn.body:
        for v in [o.value for o in inst.operands if isinstance(o, Const)] + (
            [inst.attrs["value"]] if inst.op == "literal" else []
        ):
            if isinstance(v, float) and not math.isfinite(v):
                raise ExpressionError(
                    f"{expression}: a number is not a finite {fn.result_type.dtype.value} "
                    f"(it reads as {v}); write numbers within the dtype's range"
                )
    return fn


def nesting_depth(text: str) -> int:
    """How deeply `text` nests: the deeper of its parentheses and, when it reads as Python,
    its syntax tree (`A + A + ... + A` nests without parentheses). Iterative: any depth."""
    depth = deepest = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        return deepest
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return deepest  # an s-expression (or not an expression: the reader says why)
    except (RecursionError, MemoryError):
        return MAX_DEPTH + 1  # deeper than CPython's own parser goes
    stack = [(tree.body, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend(
            (child, d + 1)
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, ast.expr_context)  # Load: a field, not a level
        )
    return deepest


def _multiplies(g, choice: dict[str, str], root: str, types) -> int:
    """Multiply-adds of the matmuls reachable from root (each shared one once)."""
    total, seen, stack = 0, set(), [root]
    while stack:
        cls = stack.pop()
        if cls in seen or cls not in choice:
            continue
        seen.add(cls)
        d = g.decode(choice[cls])
        kids = [g.eclass(c) for c in d.children]
        if d.op is not None and OPS[d.op].cost == MATMUL_COST:  # dot, and Gemm (a dot's reads)
            operands = [types[k] for k in kids]
            if d.egg in EGRAPH_ONLY:
                operands = read_types(EGRAPH_ONLY[d.egg], d.attrs, operands)
            sa, sb = operands[0].shape, operands[1].shape
            total += math.prod(sa) * (sb[-1] if len(sb) == 2 else 1)
        stack.extend(kids)
    return total
