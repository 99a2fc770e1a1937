"""What verify-rules found: one RuleResult per rule (per direction of a birewrite).

report.ok / report.ok_strict, report.failed, report.skipped, report.unproven
print(report)            # problems, then "N rules in ...: P proven, ..., F failed"
report.render(verbose=True)   # every rule
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .identity import NUMERIC_ONLY, PROVEN, PROVEN_AE, UNPROVEN

FAILED, SKIPPED, NOTHING, DEFINITION = "FAILED", "skipped", "nothing to check", "definition"


@dataclass
class RuleResult:
    where: str  # file:line
    text: str  # the rule's source text
    status: str  # proven, proven a.e., checked numerically, unproven, FAILED, skipped, ...
    detail: str = ""  # why skipped / what failed / what is unproven
    assignments: int = 0  # shape assignments checked numerically
    symbolic: int = 0  # ... and exactly
    ruleset: str | None = None
    direction: str = ""
    name: str | None = None  # the rule's :name

    @property
    def label(self) -> str:
        text = " ".join(self.text.split())
        if len(text) > 110:
            text = text[:107] + "..."
        name = f" [{self.name}]" if self.name else ""
        direction = f" ({self.direction})" if self.direction else ""
        return f"{self.where}{name}: {self.status}{direction}: {text}"

    def render(self) -> str:
        out = self.label
        if self.detail:
            out += "\n" + "\n".join("    " + line for line in self.detail.splitlines())
        return out


@dataclass
class RulesReport:
    files: list[str]
    results: list[RuleResult] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def failed(self) -> list[RuleResult]:
        return [r for r in self.results if r.status == FAILED]

    @property
    def skipped(self) -> list[RuleResult]:
        return [r for r in self.results if r.status == SKIPPED]

    @property
    def unproven(self) -> list[RuleResult]:
        return [r for r in self.results if r.status == UNPROVEN]

    @property
    def numeric_only(self) -> list[RuleResult]:
        """Rules sympy ran out of time on (load-dependent): checked numerically only."""
        return [r for r in self.results if r.status == NUMERIC_ONLY]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def ok_strict(self) -> bool:
        return not (self.failed or self.skipped or self.unproven)

    def summary(self) -> str:
        parts = [
            f"{len(self.results)} rules in {', '.join(self.files)}:",
            f"{self.count(PROVEN)} proven",
            f"{self.count(PROVEN_AE)} proven a.e.",
            f"{self.count(NUMERIC_ONLY)} checked numerically (sympy out of time)",
            f"{self.count(UNPROVEN)} unproven (numerically consistent)",
            f"{self.count(NOTHING)} with nothing to check",
            f"{self.count(DEFINITION)} definitions",
            f"{self.count(SKIPPED)} skipped",
            f"{self.count(FAILED)} failed",
        ]
        return parts[0] + " " + ", ".join(parts[1:]) + f" ({self.seconds:.1f} s)"

    def render(self, verbose: bool = False) -> str:
        shown = [
            r
            for r in self.results
            if verbose or r.status in (FAILED, SKIPPED, UNPROVEN, NUMERIC_ONLY)
        ]
        return "\n".join([r.render() for r in shown] + [self.summary()])

    def __str__(self) -> str:
        return self.render()
