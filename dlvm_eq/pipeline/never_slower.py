"""Never slower (issue 36): the e-graph's program replaces the one written only where its
predicted gain is larger than the cost model's measured error; otherwise the original is kept.

    choice = choose_program(original_plan, optimized_plan, "cpu")
    choice.kept                  # "optimized" or "original"
    str(choice)                  # "never slower: kept the original: predicted 1.01x, ..."
    dq.optimize(module)          # asks guard_for(target) about each program it would replace

The gain is the planned programs' predicted times (calibration/plan_cost.py: every step of the
plan priced, after fusion), original over optimized. PREDICTION_ERROR is how far predicted
speedups were from measured ones over benchmarks/egraph_value.py's models with the shipped
cost model: tests/data/egraph_value_programs.json holds the record, and
tests/test_never_slower.py recomputes the error from it. Numerically stable rewrites
(egraph/stability.py) are kept whatever their predicted gain: they are not a speed decision.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..codegen import Plan
from ..ir.module import Function, Module

# The median over the benchmark's models of |log(predicted / measured speedup)|, shipped
# defaults, one thread (tests/data/egraph_value_programs.json: 20 models, re-recorded at the
# start of session 17 on a quiet machine, load 0.7-0.9, after the session-16 layout rules changed
# the plans; 0.020 in session 14, also quiet; 0.04 and 0.058 recorded under load 10-14): a
# predicted gain below this is within the cost model's error.
PREDICTION_ERROR = 0.015


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
        if math.isnan(self.predicted_original):  # kept without planning the original
            return f"never slower: kept the {self.kept}: {self.reason}"
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
        return dataclasses.replace(
            stable_choice(stable, error), predicted_original=before, predicted_optimized=after
        )
    if gain > 1.0 + error:
        return ProgramChoice(
            "optimized", before, after, error, f"above the cost model's error ({error:.0%})"
        )
    return ProgramChoice(
        "original", before, after, error, f"within the cost model's error ({error:.0%})"
    )


def stable_choice(stable: tuple[str, ...], error: float = PREDICTION_ERROR) -> ProgramChoice:
    """The choice where numerically stable rewrites made the optimized form: it is kept
    whatever the plans predict, so neither needs planning to decide (NaN: not predicted)."""
    reason = "numerically stable forms: " + ", ".join(stable)
    return ProgramChoice("optimized", math.nan, math.nan, error, reason)


def plans_compared(
    old: Function,
    new: Function,
    module: Module | None,
    target: str,
    stable: tuple[str, ...] = (),
    new_module: Module | None = None,
) -> tuple[ProgramChoice, Plan]:
    """(the guard's choice between two forms of one straight function, the plan of the form
    it keeps); `module` (`new_module` for `new`, where given) holds what they apply. Planned
    here, not through planning.planned's cache: its key prints each module."""
    from ..codegen import rows_for
    from .planning import plan_function

    rows = rows_for(target)
    after = plan_function(new, new_module or module, rows=rows, target=target)
    if stable:  # kept whatever the original's plan predicts: it is not planned
        return stable_choice(stable), after
    before = plan_function(old, module, rows=rows, target=target)
    choice = choose_program(before, after, target, stable=stable)
    return choice, (after if choice.kept == "optimized" else before)


class _Guard:
    """The guard of one target: a callable with the cost model's error beside it, which
    egraph/attention_guarded.py reads (the e-graph layer cannot import this module)."""

    def __init__(self, target: str):
        self.target = target
        self.error = PREDICTION_ERROR

    def __call__(
        self, old: Function, new: Function, module: Module | None, stable=()
    ) -> ProgramChoice:
        if stable:  # kept whatever the plans predict: neither is planned (a loop's pieces
            return stable_choice(tuple(stable))  # and bodies are planned again to compile)
        before, after = (_planned_alone(f, module, self.target) for f in (old, new))
        return choose_program(before, after, self.target)


def guard_for(target: str) -> _Guard:
    """The guard egraph/optimize.optimize asks about each program it would replace (a
    function, or a straight piece or body of one with loops): `guard(old, new, module,
    stable)` -> the ProgramChoice between their plans; `guard.error` is PREDICTION_ERROR."""
    return _Guard(target)


def _planned_alone(fn: Function, module: Module | None, target: str) -> Plan:
    """fn's plan, through the plan cache (pipeline/planning.planned: by its text) where fn
    applies no other function: a second process compiling the same loops finds the guard's
    plans there (a loop's pieces and bodies: small texts, unlike a whole module's)."""
    from ..codegen import rows_for
    from .planning import plan_function, planned

    # The plan cache keys by a target's name: a Machine (a calibrated or test profile) has
    # none, so its plans are made afresh.
    if not isinstance(target, str) or any(i.op == "apply" for i in fn.body):
        return plan_function(fn, module, rows=rows_for(target), target=target)
    alone = Module(fn.name)
    alone.add(fn)
    return planned(alone, fn.name, target)


__all__ = [
    "PREDICTION_ERROR",
    "ProgramChoice",
    "choose_program",
    "guard_for",
    "plans_compared",
    "stable_choice",
]
