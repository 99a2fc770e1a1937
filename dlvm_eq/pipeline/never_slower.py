"""Never slower (issue 36): the e-graph's program replaces the one written only where its
predicted gain is larger than the cost model's measured error; otherwise the original is kept.

    choice = choose_program(original_plan, optimized_plan, "cpu")
    choice.kept                  # "optimized" or "original"
    str(choice)                  # "never slower: kept the original: predicted 1.01x, ..."

The gain is the planned programs' predicted times (calibration/plan_cost.py: every step of the
plan priced, after fusion), original over optimized. PREDICTION_ERROR is how far predicted
speedups were from measured ones over benchmarks/egraph_value.py's models with the shipped
cost model: tests/data/egraph_value_programs.json holds the record, and
tests/test_never_slower.py recomputes the error from it. Numerically stable rewrites
(egraph/stability.py) are kept whatever their predicted gain: they are not a speed decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..codegen import Plan

# The median over the benchmark's models and runs of |log(predicted / measured speedup)|,
# shipped defaults, one thread (tests/data/egraph_value_programs.json: 40 model runs, recorded
# on a quiet machine, load 0.5, after the session-14 merges changed the plans; 0.04 and 0.058
# before, both recorded under load 10-14): a predicted gain below this is within the cost
# model's error.
PREDICTION_ERROR = 0.020


@dataclass(frozen=True)
class ProgramChoice:
    kept: str  # "optimized" or "original"
    predicted_original: float  # seconds per call
    predicted_optimized: float
    error: float
    reason: str

    @property
    def predicted_gain(self) -> float:
        if self.predicted_optimized <= 0:
            return float("inf")
        return self.predicted_original / self.predicted_optimized

    def __str__(self) -> str:
        return (
            f"never slower: kept the {self.kept}: predicted {self.predicted_gain:.3f}x "
            f"({self.predicted_original * 1e6:.1f} us -> {self.predicted_optimized * 1e6:.1f} us), "
            f"{self.reason}"
        )


def choose_program(
    original: Plan,
    optimized: Plan,
    target: str = "cpu",
    error: float = PREDICTION_ERROR,
    stable: tuple[str, ...] = (),
) -> ProgramChoice:
    """Which of two plans of one function to run: the optimized one where its predicted gain
    exceeds `error` (a fraction) or where numerically stable rewrites made it (`stable`)."""
    from ..calibration.plan_cost import predict_plan

    before = predict_plan(original, target).seconds
    after = predict_plan(optimized, target).seconds
    gain = before / after if after > 0 else float("inf")
    if stable:
        return ProgramChoice(
            "optimized", before, after, error, "numerically stable forms: " + ", ".join(stable)
        )
    if gain > 1.0 + error:
        return ProgramChoice(
            "optimized", before, after, error, f"above the cost model's error ({error:.0%})"
        )
    return ProgramChoice(
        "original", before, after, error, f"within the cost model's error ({error:.0%})"
    )


__all__ = ["PREDICTION_ERROR", "ProgramChoice", "choose_program"]
