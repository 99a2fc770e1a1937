"""What `dq.optimize` says it did: per function, saturation, extraction and costs.

result = dq.optimize(module)
print(result.report)          # one paragraph per function
result.report["f"].speedup    # cost_before / cost_after
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..units import seconds_text
from .rule_origin import user_rule_locations
from .saturate import SaturationReport


@dataclass
class FunctionReport:
    name: str
    cost_before: float  # estimated seconds on the target (same model both)
    cost_after: float
    saturation: SaturationReport | None = None
    extractor: str = "greedy"
    extraction_status: str = ""
    e_classes: int = 0  # Term e-classes of the serialized e-graph
    ops_before: int = 0  # IR instructions
    ops_after: int = 0
    kept_original: bool = False  # the extracted program was not cheaper
    note: str = ""  # why the original was kept, or what happened
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    # with explain: (result as written, result extracted) per returned value, in infix form
    results: list[tuple[str, str]] = field(default_factory=list)
    # the user's rules that fired: (file, line, rule, matches), most matches first
    user_rules: list[tuple[str, int, str, int]] = field(default_factory=list)
    attention: list[str] = field(default_factory=list)  # issue 33: fused or plain, and why
    layout: list[str] = field(default_factory=list)  # issue 36: transposes moved, cancelled
    # issue 36: the never-slower guard's choice per program it compared (pipeline/never_slower.py)
    never_slower: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.cost_before / self.cost_after if self.cost_after > 0 else float("inf")

    def __str__(self) -> str:
        head = (
            f"@{self.name}: cost {seconds_text(self.cost_before)} -> {seconds_text(self.cost_after)}"
            f" (x{self.speedup:.3g}), {self.ops_before} -> {self.ops_after} instructions"
        )
        lines = [head]
        if self.kept_original:
            lines.append(f"  kept the original: {self.note}")
        elif self.note:
            lines.append(f"  {self.note}")
        for i, (before, after) in enumerate(self.results):
            label = f"  result {i}: " if len(self.results) > 1 else "  result: "
            pad = " " * len(label)
            if self.kept_original or before == after:
                lines.append(f"{label}{before}   (unchanged)")
            else:
                lines.append(f"{label}{before}")
                lines.append(f"{pad[:-4]}->  {after}")
        lines.extend("  " + line for line in self.attention + self.layout + self.never_slower)
        if self.saturation is not None:
            lines.extend("  " + line for line in str(self.saturation).splitlines())
        if self.user_rules:
            lines.append(
                "  your rules fired: "
                + ", ".join(f"{f}:{ln} {r} x{n}" for f, ln, r, n in self.user_rules)
            )
        lines.append(
            f"  extraction: {self.extractor} ({self.extraction_status or 'ok'}) over "
            f"{self.e_classes} e-classes"
        )
        if self.seconds:
            lines.append("  time: " + ", ".join(f"{k} {v:.3f} s" for k, v in self.seconds.items()))
        return "\n".join(lines)


@dataclass
class OptimizeReport:
    target: str
    functions: dict[str, FunctionReport] = field(default_factory=dict)

    def __getitem__(self, name: str) -> FunctionReport:
        return self.functions[name.lstrip("@")]

    def __iter__(self):
        return iter(self.functions.values())

    def __str__(self) -> str:
        if not self.functions:
            return f"optimize ({self.target}): no function with a body"
        return f"optimize (target {self.target}):\n" + "\n".join(
            str(f) for f in self.functions.values()
        )


def user_rules_fired(session, saturation) -> list[tuple[str, int, str, int]]:
    """(file, line, rule, matches) of each rule of the user's files that fired in `saturation`,
    most matches first: what a report shows of them."""
    fired = getattr(saturation, "rule_matches", None) or {}
    if not fired:
        return []
    where = user_rule_locations(session)
    hits = []
    for rule, n in sorted(fired.items(), key=lambda kv: (-kv[1], kv[0])):
        text = " ".join(rule.split())
        loc = where.get(rule) or where.get(text)
        if loc is not None:
            hits.append((loc[0], loc[1], text if len(text) <= 60 else text[:57] + "...", n))
    return hits
