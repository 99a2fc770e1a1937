"""What the fusion stage decided, as the compile report prints it: the plan's record of the
decision it was given (egraph/fusion_decision.py fills it in). It lives with the plan because kernel
plans are cached (as JSON data) with their report, and reading one imports no e-graph."""

from __future__ import annotations

from dataclasses import field

from ...records import dataclass


@dataclass
class FusionReport:
    """What the fusion decision did: e-graph size, values kept or inlined, model costs, seconds."""

    nodes: int = 0  # e-nodes after saturation
    classes: int = 0
    stop_reason: str = ""  # saturated, iterations, nodes, seconds
    iterations: int = 0
    values: int = 0  # elementwise values (maps) the choice is about
    materialized: int = 0  # of which kept in buffers by choice
    forced: int = 0  # of which kept in buffers because they must be
    inlined: int = 0  # recomputed where they are read
    cost_unfused: float = 0.0  # model seconds, every elementwise value its own kernel
    cost: float = 0.0  # model seconds of the chosen plan
    method: str = "greedy"
    note: str = ""
    seconds: dict = field(default_factory=dict)
    shared: int = 0  # reductions priced in one pass with their space's maps (multi-output)
    shared_saving: float = 0.0  # model seconds those passes save
    row_shared: int = 0  # reductions over trailing axes sharing a row pass with others
    row_shared_saving: float = 0.0  # model seconds those row passes save
    # one line per kernel whose reductions share a pass (planning/map_reduce.note_passes):
    # which kernel, which reductions (IR values), how many map outputs, the predicted saving
    passes: list = field(default_factory=list)

    def __str__(self) -> str:
        from ...units import seconds_text

        ms = sum(self.seconds.values()) * 1e3
        text = (
            f"fusion: e-graph {self.nodes} e-nodes ({self.stop_reason}, {self.iterations} "
            f"iteration{'s' * (self.iterations != 1)}); {self.values} elementwise values: "
            f"{self.materialized + self.forced} materialized ({self.forced} required), "
            f"{self.inlined} inlined; cost (model) {seconds_text(self.cost_unfused)} unfused -> "
            f"{seconds_text(self.cost)}; {ms:.1f} ms"
        )
        if self.shared:
            text += (
                f"; {self.shared} reduction{'s' * (self.shared != 1)} in one pass with their "
                f"maps, saving {seconds_text(self.shared_saving)} (model)"
            )
        if self.row_shared:
            text += (
                f"; {self.row_shared} row reduction{'s' * (self.row_shared != 1)} sharing "
                f"row passes, saving {seconds_text(self.row_shared_saving)} (model)"
            )
        text += f"; {self.note}" if self.note else ""
        return "\n    ".join([text] + [f"one pass: {line}" for line in self.passes])
