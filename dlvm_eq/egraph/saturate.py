"""Budgeted saturation of an EGraphSession: one ruleset iteration at a time, the `analysis`
ruleset saturated in between, sizes checked between steps (egglog's `run` has no node limit).
It always stops, and says why.

    report = saturate(session, Schedule.default(), Budget(nodes=20_000))
    report.stop_reason      # "saturated", "iterations", "nodes" or "seconds"
    report.rule_matches     # {"x+0": 3, "(AB)C": 40, ...}
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from ..errors import DlvmError
from .schedule import Budget, Schedule
from .session import EGraphSession

STOP_REASONS = ("saturated", "iterations", "nodes", "seconds")


@dataclass
class SaturationReport:
    stop_reason: str                          # one of STOP_REASONS
    iterations: int                           # rounds over the schedule begun
    nodes_before: int
    nodes: int                                # e-nodes (constructor rows) at the end
    seconds: float
    budget: Budget
    schedule: Schedule
    rule_matches: dict[str, int] = field(default_factory=dict)     # rule -> matches, > 0 only
    ruleset_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def saturated(self) -> bool:
        return self.stop_reason == "saturated"

    def top_rules(self, n: int | None = None) -> list[tuple[str, int]]:
        return sorted(self.rule_matches.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def __str__(self) -> str:
        why = {"saturated": "saturated (no rule changes anything)",
               "iterations": f"iteration budget ({self.budget.iterations}) reached",
               "nodes": f"e-node budget ({self.budget.nodes}) reached (or the next step would pass it twice over)",
               "seconds": f"time budget ({self.budget.seconds:g} s) reached"}[self.stop_reason]
        lines = [f"saturation: {why} after {self.iterations} iteration(s), {self.seconds:.3f} s; "
                 f"e-nodes {self.nodes_before} -> {self.nodes}"]
        if self.rule_matches:
            lines.append("rules fired (matches): " + ", ".join(
                f"{rule_label(r)} x{n}" for r, n in self.top_rules()))
        return "\n".join(lines)


def rule_label(name: str) -> str:
    """A rule's name; unnamed rules are named by egglog with their text: keep its first line."""
    first = " ".join(name.split())
    return first if len(first) <= 60 else first[:57] + "..."


def node_count(session: EGraphSession) -> int:
    """E-nodes: rows of constructors (capitalized, as in the schema), not of analyses."""
    (out,) = session.run_text("(print-size)")
    return sum(n for name, n in out.sizes if name[:1].isupper())


def saturate(session: EGraphSession, schedule: Schedule | None = None, budget=None) -> SaturationReport:
    """Run `schedule` on the session's e-graph until nothing changes or a budget is reached."""
    schedule = schedule or Schedule.default()
    budget = Budget.of(budget)
    start = time.perf_counter()
    session.run_analysis()
    nodes_before = nodes = node_count(session)
    matches: Counter[str] = Counter()
    ruleset_seconds: Counter[str] = Counter()
    unknown = [rs for rs in schedule.rulesets if rs and rs not in session.rulesets]
    if unknown:
        raise DlvmError(f"the schedule names ruleset(s) {', '.join(unknown)} that no loaded rule "
                        f"file declares (declared: {', '.join(session.rulesets) or 'none'})")
    steps = list(schedule.rulesets)
    reason, rounds = "iterations", 0
    history: dict[str, tuple[float, float, int]] = {}   # ruleset -> (secs, previous secs, nodes)
    growth: dict[str, float] = {}                       # ruleset -> e-nodes after / before its last step

    def report(why: str) -> SaturationReport:
        return SaturationReport(why, rounds, nodes_before, nodes, time.perf_counter() - start,
                                budget, schedule, {k: v for k, v in matches.items() if v},
                                dict(ruleset_seconds))

    if nodes > budget.nodes:
        return report("nodes")
    while rounds < budget.iterations:
        rounds += 1
        changed = False
        for rs in steps:
            # an egglog iteration cannot be interrupted: do not start one that would overrun
            if time.perf_counter() - start + _predict(history.get(rs), nodes, budget) > budget.seconds:
                return report("seconds")
            # nor one that, growing as its last one did, would end far past the e-node budget
            # (extraction time grows with the e-graph)
            if nodes * growth.get(rs, 1.0) > 2 * budget.nodes:
                return report("nodes")
            t0 = time.perf_counter()
            run, _ = session.run_text(f"(run-schedule (run {rs}))\n(run-schedule (saturate (run analysis)))")
            took = time.perf_counter() - t0
            history[rs] = (took, history.get(rs, (took,))[0], nodes)
            ruleset_seconds[rs or "(default)"] += took
            matches.update(run.report.num_matches_per_rule)
            changed |= run.report.updated
            before, nodes = nodes, node_count(session)
            growth[rs] = nodes / max(before, 1)
            if nodes > budget.nodes:
                return report("nodes")
        if not changed:
            reason = "saturated"
            break
    return report(reason)


def _predict(last: tuple[float, float, int] | None, nodes: int, budget: Budget) -> float:
    """Seconds the next iteration of a ruleset may take: its last iteration's time, scaled by
    how much the e-graph and its own time grew since (explosive rules grow geometrically).
    Steps under 1% of the budget are not extrapolated: their times are mostly noise."""
    if last is None:
        return 0.0
    took, before, nodes_then = last
    if took < 0.01 * budget.seconds:
        return took
    growth = max(1.0, nodes / max(nodes_then, 1), took / before if before > 0 else 1.0)
    return took * growth
