"""What the e-graph that built an adjoint did, for a jitted gradient's compile report (issue 32:
under jit a gradient's algebra saturates once, with the adjoint, and the module's second pass
is skipped, so this e-graph is the one the report shows). Light to import: a warm compile
reads its adjoints from the cache and records only that.

    AdjointReport("loss_grad", "loss", saturation, 39, 35.9e-6).lines()
    # ["e-graph (the adjoint of @loss, forward and gradient together): 39 e-classes, ..."]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..units import seconds_text

if TYPE_CHECKING:
    from .saturate import SaturationReport


@dataclass
class AdjointReport:
    """One adjoint's e-graph: its size, why saturation stopped, the rules that fired and the
    cost extracted. `from_cache`: read from the IR cache, no e-graph built (no figures)."""

    name: str  # the adjoint function
    of: str  # the function differentiated
    saturation: SaturationReport | None = None
    e_classes: int = 0  # Term e-classes of the serialized e-graph
    cost: float = 0.0  # the model's seconds of forward and gradient, extracted together
    extractor: str = "greedy"
    extraction_status: str = ""
    attention: list[str] = field(default_factory=list)  # issue 33: fused or plain, and why
    seconds: dict[str, float] = field(default_factory=dict)  # saturate, serialize, extract
    from_cache: bool = False
    note: str = ""  # what else happened (a time cut, not optimized)

    def lines(self) -> list[str]:
        """The compile report's lines for this adjoint's e-graph."""
        head = f"e-graph (the adjoint of @{self.of}, forward and gradient together)"
        if self.from_cache:
            return [f"{head}: none built, the adjoint was read from the compile cache"]
        sat = self.saturation
        if sat is None:
            return [f"{head}: {self.note or 'not optimized (adjoint rules only)'}"]
        out = [
            f"{head}: {self.e_classes} e-classes, e-nodes {sat.nodes_before} -> {sat.nodes}"
            f" ({sat.stop_reason}, {sat.iterations} iterations)",
            f"  rules fired: {rules_fired_text(sat) or 'none'}",
            f"  cost (model): {seconds_text(self.cost)} extracted ({self.extractor}, "
            f"{self.extraction_status or 'ok'})",
        ]
        out.extend("  " + line for line in self.attention)
        if self.note:
            out.append(f"  {self.note}")
        return out


def rules_fired_text(sat, top: int = 8) -> str:
    """The `top` rules that matched most, with their matches ("--x x5, ..."); "" for none."""
    if sat is None or not sat.rule_matches:
        return ""
    from .saturate import rule_label  # only where an e-graph ran: egglog is loaded

    ranked = sat.top_rules()
    return ", ".join(f"{rule_label(r)} x{n}" for r, n in ranked[:top]) + (
        ", ..." if len(ranked) > top else ""
    )
