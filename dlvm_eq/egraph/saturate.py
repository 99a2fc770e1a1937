"""Budgeted saturation of an EGraphSession, the one driver every e-graph of the compiler runs
(the optimizer, the adjoint expansion, the fusion stage): one ruleset iteration at a time, the
`analysis` ruleset saturated in between, sizes, work and the deadline checked around every step.
It always stops, and says why.

    report = saturate(session, Schedule.default(), Budget(nodes=20_000))
    report.stop_reason      # "saturated", "iterations", "nodes", "work" or "seconds"
    report.rule_matches     # {"x+0": 3, "(AB)C": 40, ...}
    report.work             # work units spent (egraph/deadline.py): the same on every machine

Every decision that shapes the e-graph (when to stop, how many matches a step may apply) is
taken on counts (iterations, e-nodes, matches, work), never on the clock: a busy machine
saturates as far as a quiet one. The deadline is a safety net only; a stop or a held-back rule
it causes is noted (cache.note_time_cut), so that its result is not cached.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from ..cache import note_time_cut
from ..errors import DlvmError
from .deadline import Deadline, step_work
from .ruleset_schedule import Budget, Schedule
from .session import EGraphSession

STOP_REASONS = ("saturated", "iterations", "nodes", "work", "seconds")
NODES_PER_MATCH = 2  # e-nodes a rewrite adds per match, about (sets the match limit)


@dataclass
class SaturationReport:
    stop_reason: str  # one of STOP_REASONS
    iterations: int  # rounds over the schedule begun
    nodes_before: int
    nodes: int  # e-nodes (constructor rows) at the end
    seconds: float
    budget: Budget
    schedule: Schedule
    rule_matches: dict[str, int] = field(default_factory=dict)  # rule -> matches, > 0 only
    ruleset_seconds: dict[str, float] = field(default_factory=dict)
    held_back: dict[str, int] = field(default_factory=dict)  # rule -> matches not applied (budget)
    work: int = 0  # work units spent (egraph/deadline.py), counted the same on every machine

    @property
    def saturated(self) -> bool:
        return self.stop_reason == "saturated"

    def top_rules(self, n: int | None = None) -> list[tuple[str, int]]:
        return sorted(self.rule_matches.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def __str__(self) -> str:
        why = {
            "saturated": "saturated (no rule changes anything)",
            "iterations": f"iteration budget ({self.budget.iterations}) reached",
            "nodes": f"e-node budget ({self.budget.nodes}) reached",
            "work": f"work budget ({self.budget.work:,}) reached (work kept for extraction)",
            "seconds": f"time budget ({self.budget.seconds:g} s) reached (time kept for extraction)",
        }[self.stop_reason]
        lines = [
            f"saturation: {why} after {self.iterations} iteration(s), {self.seconds:.3f} s; "
            f"e-nodes {self.nodes_before} -> {self.nodes}; work {self.work:,}"
        ]
        if self.rule_matches:
            lines.append(
                "rules fired (matches): "
                + ", ".join(f"{rule_label(r)} x{n}" for r, n in self.top_rules())
            )
        if self.held_back:
            lines.append(
                "held back by the budget (matches): "
                + ", ".join(
                    f"{rule_label(r)} x{n}"
                    for r, n in sorted(self.held_back.items(), key=lambda kv: -kv[1])
                )
            )
        return "\n".join(lines)


def rule_label(name: str) -> str:
    """A rule's name; unnamed rules are named by egglog with their text: keep its first line."""
    first = " ".join(name.split())
    return first if len(first) <= 60 else first[:57] + "..."


def node_count(session: EGraphSession) -> int:
    """E-nodes: rows of constructors (capitalized, as in the schema), not of analyses."""
    (out,) = session.run_text("(print-size)")
    return sum(n for name, n in out.sizes if name[:1].isupper())


def saturate(
    session: EGraphSession,
    schedule: Schedule | None = None,
    budget=None,
    *,
    deadline: Deadline | None = None,
    reserve=None,
    analysis: str | None = "analysis",
    reserve_work=None,
) -> SaturationReport:
    """Run `schedule` on the session's e-graph until nothing changes or a budget is reached.

    deadline: when the whole call must be done (default: budget.seconds from now).
    reserve_work(nodes) -> work units: the work to keep for what follows (extracting an e-graph
    of that size; see deadline.extraction_work): saturation stops while budget.work still
    covers it. reserve(nodes) -> seconds: the same for the safety-net deadline
    (deadline.extraction_seconds). analysis: the ruleset saturated after every step (None: none).

    Each step runs one iteration of one ruleset (Schedule.step of them). Where a rule may find
    more matches than the budget has room for (the nodes budget, or what the work left can
    still extract), the step runs under egglog's back-off scheduler with that match limit: it
    holds back any rule with more matches, so a step adds at most about NODES_PER_MATCH
    e-nodes per match it applies and cannot overshoot far. Held-back rules are reported."""
    run = _Saturation(
        session,
        schedule or Schedule.default(),
        Budget.of(budget),
        deadline,
        reserve or (lambda nodes: 0.0),
        analysis,
        reserve_work or (lambda nodes: 0),
    )
    why = run.rounds_until_stop()
    if why == "seconds":
        note_time_cut(f"saturation: time budget ({run.budget.seconds:g} s) reached")
    elif run.held_by_time:
        note_time_cut(f"saturation: rules held back by the time budget ({run.budget.seconds:g} s)")
    return run.report(why)


class _Saturation:
    """One saturate call: the e-graph's size, each ruleset's last step (time, matches) and
    what fired so far."""

    def __init__(
        self,
        session: EGraphSession,
        schedule: Schedule,
        budget: Budget,
        deadline: Deadline | None,
        reserve,
        analysis: str | None,
        reserve_work,
    ):
        self.session, self.schedule, self.budget = session, schedule, budget
        self.deadline = deadline or Deadline(budget.seconds)
        self.reserve, self.analysis, self.reserve_work = reserve, analysis, reserve_work
        self.work = 0  # work units spent (deadline.step_work per step)
        self.held_by_time = False  # the deadline held a rule back (a time cut: noted)
        self.work_history: dict[str, tuple[float, int]] = {}  # ruleset -> (work, nodes then)
        self.start = time.perf_counter()
        if analysis:
            session.run_text(f"(run-schedule (saturate (run {analysis})))")
        self.nodes_before = self.nodes = node_count(session)
        self.rounds = 0
        self.matches: Counter[str] = Counter()
        self.held_back: Counter[str] = Counter()
        self.ruleset_seconds: Counter[str] = Counter()
        self.history: dict[str, tuple[float, float, int]] = {}  # ruleset -> (secs, previous, nodes)
        self.peak: dict[str, tuple[int, int]] = {}  # ruleset -> (most matches of a rule, nodes)
        self.iterations: dict[str, int] = {}  # ruleset -> iterations in its next step
        unknown = [rs for rs in schedule.rulesets if rs and rs not in session.rulesets]
        if unknown:
            raise DlvmError(
                f"the schedule names ruleset(s) {', '.join(unknown)} that no loaded rule "
                f"file declares (declared: {', '.join(session.rulesets) or 'none'})"
            )

    def report(self, why: str) -> SaturationReport:
        return SaturationReport(
            why,
            self.rounds,
            self.nodes_before,
            self.nodes,
            time.perf_counter() - self.start,
            self.budget,
            self.schedule,
            {k: v for k, v in self.matches.items() if v},
            dict(self.ruleset_seconds),
            dict(self.held_back),
            self.work,
        )

    def rounds_until_stop(self) -> str:
        """Rounds over the schedule until one changes nothing or a budget is reached: why."""
        if self.nodes > self.budget.nodes:
            return "nodes"
        while self.rounds < self.budget.iterations:
            self.rounds += 1
            changed, held_by = False, None  # held_by: which budget held a rule back
            for rs in self.schedule.rulesets:
                stop, step_changed, step_held_by = self.step(rs)
                if stop:
                    return stop
                changed |= step_changed
                held_by = step_held_by or held_by
            if not changed:
                return held_by or "saturated"
        return "iterations"

    def step(self, rs: str) -> tuple[str | None, bool, str | None]:
        """One step of ruleset rs: (the budget that stops saturation or None, whether the
        e-graph changed, the budget that held a rule back or None)."""
        budget, deadline, nodes = self.budget, self.deadline, self.nodes
        reserve, reserve_work = self.reserve, self.reserve_work
        # an egglog iteration cannot be interrupted: do not start one that would overrun
        # egglog's `repeat` runs every iteration even when nothing changes: a step's iterations
        # start at one and double while steps change something, up to the schedule's step
        # (a 3-iteration adjoint expansion ran 2 x 64 iterations)
        last = self.iterations.get(rs, 1)
        iterations = last if rs not in self.history else min(2 * last, self.schedule.step)
        # the work budget (what decides the program): counted, the same on every machine
        work = _predict(self.work_history.get(rs), nodes, budget.work) * iterations / last
        work_left = budget.work - self.work
        if work + reserve_work(nodes) >= work_left:
            return "work", False, None
        # the safety net: the same prediction in seconds, against the deadline
        predicted = _predict(self.history.get(rs), nodes, budget.seconds) * iterations / last
        left = deadline.left()
        if predicted + reserve(nodes) >= left:
            return "seconds", False, None
        # the e-nodes this step may reach: the node budget, (safety net) what the time left
        # can still extract, and what the work left after the step can. The work's room only
        # once the ruleset has run: a first step's matches are only guessed (16 an e-node), and
        # the scheduler changes what a step builds even where it holds nothing back (a tanh-30
        # gradient's plan changed); when budgets were seconds, the node budget alone judged
        # first steps on a quiet machine, so the plans stay those
        room, limiter = min(
            ((budget.nodes, "nodes"), (nodes_within_reserve(reserve, left - predicted), "seconds")),
            key=lambda r: r[0],
        )
        by_work = nodes_within_reserve(reserve_work, work_left - work)
        if by_work < room and rs in self.peak:
            room, limiter = by_work, "work"
        limit = (room - nodes) // NODES_PER_MATCH
        if limit < 1:
            return limiter, False, None
        # the scheduler costs ~5 ms a step: only where a rule may come near the limit
        guarded = _expected_matches(self.peak.get(rs), nodes) * 4 >= limit
        t0 = time.perf_counter()
        out = self.session.run_text(
            _step_text(rs, limit if guarded else None, iterations, self.analysis)
        )
        took = time.perf_counter() - t0
        run = out[0].report
        self.history[rs] = (took, self.history.get(rs, (took,))[0], nodes)
        self.iterations[rs] = iterations
        self.ruleset_seconds[rs or "(default)"] += took
        self.matches.update(run.num_matches_per_rule)
        most, found = _matches_found(run)
        self.peak[rs] = (most, nodes)
        step_held = _held_back(run, limit) if guarded else {}
        self.held_back.update(step_held)
        self.held_by_time |= bool(step_held) and limiter == "seconds"
        # a step that changed nothing added no e-node (the analysis after it had nothing new
        # to do either): its count is not asked again (a print-size per step, ~0.1 ms each)
        self.nodes = node_count(self.session) if run.updated else nodes
        done = step_work(nodes, iterations, found, self.nodes - nodes)
        self.work += done
        self.work_history[rs] = (done, nodes)
        # under the scheduler `updated` is also set when only held-back rules matched
        changed = self.nodes != nodes or (
            any(it.rule_set_report.changed for it in run.iterations) if guarded else run.updated
        )
        if self.nodes > budget.nodes:
            return "nodes", changed, None
        if reserve_work(self.nodes) >= budget.work - self.work:
            return "work", changed, None
        if reserve(self.nodes) >= deadline.left():
            return "seconds", changed, None
        return None, changed, limiter if step_held else None


FIRST_STEP_MATCHES_PER_NODE = 16  # a ruleset never run yet: matches per e-node assumed


def _expected_matches(last: tuple[int, int] | None, nodes: int) -> float:
    """The most matches one rule of a ruleset may find in its next step: its last step's,
    grown with the e-graph (squared: patterns of two nodes)."""
    if last is None:
        return nodes * FIRST_STEP_MATCHES_PER_NODE
    most, nodes_then = last
    return max(most, 1) * max(1.0, nodes / max(nodes_then, 1)) ** 2


def _matches_found(run) -> tuple[int, int]:
    """(the most matches one rule found, all matches found), applied or held back, in a step."""
    most = max(run.num_matches_per_rule.values(), default=0)
    found = 0
    for it in run.iterations:
        for reports in it.rule_set_report.rule_reports.values():
            n = sum(r.num_matches for r in reports)
            most, found = max(most, n), found + n
    return most, max(found, sum(run.num_matches_per_rule.values()))


def _step_text(ruleset: str, limit: int | None, step: int, analysis: str | None) -> str:
    """One step: `step` iterations of `ruleset` (under a back-off scheduler with this match
    limit, unless None), each followed by the analysis saturated (in its own command for one
    iteration, so that the step's report holds only the ruleset's matches)."""
    if limit is None:
        run = f"(run{' ' + ruleset if ruleset else ''})"
        scheduler = ""
    else:
        run = f"(run-with bo{' ' + ruleset if ruleset else ''})"
        scheduler = f"(let-scheduler bo (back-off :match-limit {limit})) "
    if step == 1:
        after = f"\n(run-schedule (saturate (run {analysis})))" if analysis else ""
        return f"(run-schedule {scheduler}{run}){after}"
    body = f"(seq {run} (saturate (run {analysis})))" if analysis else run
    return f"(run-schedule {scheduler}(repeat {step} {body}))"


def nodes_within_reserve(reserve, seconds: float) -> int:
    """The largest e-node count n with reserve(n) <= seconds (reserve is increasing)."""
    if reserve(0) > seconds:
        return 0
    lo, hi = 0, 1
    while reserve(hi) <= seconds and hi < 1 << 40:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if reserve(mid) <= seconds else (lo, mid)
    return lo


def _held_back(run, limit: int) -> dict[str, int]:
    """Rules the back-off scheduler banned in this step: more matches than the limit."""
    out: dict[str, int] = {}
    applied = run.num_matches_per_rule  # a banned rule's matches are not counted there
    for it in run.iterations:
        for rule, reports in it.rule_set_report.rule_reports.items():
            n = sum(r.num_matches for r in reports)
            if n > limit and rule not in applied:
                out[rule] = max(out.get(rule, 0), n)
    return out


def _predict(last: tuple | None, nodes: int, whole: float) -> float:
    """What the next iteration of a ruleset may cost (work units or seconds: `last` holds its
    last step's cost first and the e-graph's size then last): its last step's, scaled by how
    much the e-graph grew since, squared (matches of two-node patterns grow so; explosive
    rules grow geometrically). Steps under 1% of the `whole` budget are not extrapolated: for
    seconds their times are mostly noise. In seconds, scaled by the e-graph, not by the last
    times' ratio: one step slowed by a busy machine must not stop saturation."""
    if last is None:
        return 0.0
    took, nodes_then = last[0], last[-1]
    if took < 0.01 * whole:
        return took
    return took * max(1.0, nodes / max(nodes_then, 1)) ** 2
