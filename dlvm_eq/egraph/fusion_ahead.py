"""The fusion rules of every program a caller is about to plan, compiled at once (issue 30).

    with planning_ahead([(body, module), (piece, module)]):
        plan_function(body, module)      # the first fusion e-graph compiles the rules that
        plan_function(piece, module)     # every listed program can fire; this one needs none

Why: the fusion session (egraph/optimize.FUSION_RULE_FILES) compiles the rules each program
can fire as the programs come (scratch_rules.py). A later program that needs a rule which
comes, in its ruleset's order, before one already compiled makes the session rebuild itself
(a fresh egglog e-graph, the schema and every compiled rule again: about 18 ms each). A loop
function's gradient plans its pieces and bodies one after another, each with other ops: the
LSTM's made 4 rebuilds, the GRU's 1. A caller that knows the programs ahead (a loop
function's pieces and bodies, pipeline/loops.py; the guard's plans, egraph/optimize_loops.py)
lists them, and one compile covers them all. The rules compiled are the same ones in the same
order (a superset of what each program can fire; the others never match), so the plans are
the same (tests/test_fusion_ahead.py).

Nothing happens unless a plan is built: a compile whose plans come from the plan cache never
loads the fusion rules. Per thread (a session belongs to the thread that made it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..errors import DlvmError

if TYPE_CHECKING:
    from ..ir.module import Function, Module
    from .session import EGraphSession

_local = threading.local()
# issue 30: off, each program compiles its own rules as it comes (the rebuilds above)
AHEAD = True


@contextmanager
def planning_ahead(programs: Iterable[tuple[Function, Module | None]]) -> Iterator[None]:
    """Within the block, the first fusion e-graph built in this thread first compiles the
    fusion rules that any of `programs` ((function, module of what it applies)) can fire."""
    before = getattr(_local, "pending", None)
    _local.pending = list(programs) if AHEAD else []
    try:
        yield
    finally:
        _local.pending = before


def compile_pending(session: EGraphSession) -> int:
    """Compile into `session` (the fusion session, no program open) the rules the pending
    programs can fire, once; the number of programs read (fusion_decision.fusion_graph)."""
    pending = getattr(_local, "pending", None)
    pruned = session.pruned
    if not pending or pruned is None:
        return 0
    _local.pending = []  # consumed: the block's other plans find their rules compiled
    from ..ir.inline import flatten
    from .fusion_decision import load_fusion

    texts = []
    for fn, module in pending:
        try:
            loaded = load_fusion(flatten(fn, module))
        except DlvmError:  # that plan meets the error itself, where it is reported
            continue
        texts.append(" ".join(let.term() for let in [*loaded.terms, *loaded.loads]))
    pruned.compile_for(texts, ("fusion",))
    return len(texts)


__all__ = ["AHEAD", "compile_pending", "planning_ahead"]
