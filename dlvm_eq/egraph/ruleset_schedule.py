"""What saturation runs and when it stops: the ruleset schedule and the budgets.

Budget()                                  # defaults: 1,000 IR ops optimize in a few seconds
Budget.of({"nodes": 5000})                # a dict, a Budget or None
Budget.of({"work": 500_000})              # less work: a smaller e-graph, the same on every machine
Schedule.default().with_rulesets(rulesets_in(open("extra.egg").read()))
"""

from __future__ import annotations

import re
from dataclasses import fields, replace

from ..errors import DlvmError
from ..records import dataclass

# rules/algebra.egg's rulesets, in the order one saturation round runs them
ALGEBRA_RULESETS = (
    "identities",
    "fold",
    "stable",
    "softmax",
    "transpose",
    "matmul",
    "merge",
    "factor",
    "cheap",
    "reduce",
    "sumproduct",
    "layout",
)
DEFAULT = ""  # egglog's default ruleset: rules of user files that name no ruleset
DEFAULT_WORK = 4_000_000  # Budget.work (calibrated: see there)


@dataclass(frozen=True)
class Budget:
    """Saturation stops at the first budget reached (checked around every ruleset step).

    iterations, nodes and work decide the program, and are counted, never timed: the same
    program compiles to the same plan on a busy machine as on a quiet one. `seconds` is only a
    safety net far above what the work takes; a result it cuts says so and is not cached."""

    iterations: int = 12  # rounds over the schedule
    nodes: int = 50_000  # e-nodes (rows of constructors); extraction time grows with it
    # wall time of the whole call (saturation, serialization, extraction): the safety net. A
    # 10x slower clock (tests/test_work_budget.py) must not reach it on the benchmark models
    seconds: float = 600.0
    # work units (egraph/deadline.py, about a microsecond each when quiet) of saturation plus
    # the extraction of the e-graph it leaves: every benchmark model saturates within it (the
    # most, ~0.85M) but a 32-step GRU. At 2M the GRU stopped at ~15k e-nodes and extracted a
    # program predicted 1.07 ms against 0.89 (measured 1.04 against 0.74 ms, one thread, quiet,
    # benchmarks/egraph_value.py --only gru_32); at 4M it extracts session 17's program again
    work: int = DEFAULT_WORK

    @classmethod
    def of(cls, budget) -> Budget:
        if budget is None:
            return cls()
        if isinstance(budget, Budget):
            return budget
        if isinstance(budget, dict):
            names = {f.name for f in fields(cls)}
            unknown = set(budget) - names
            if unknown:
                raise DlvmError(
                    f"unknown budget {', '.join(sorted(unknown))}; expected "
                    f"{', '.join(sorted(names))}"
                )
            return replace(cls(), **budget)
        raise DlvmError(f"a budget is a Budget, a dict or None, not {type(budget).__name__}")


@dataclass(frozen=True)
class Schedule:
    """Rulesets run round-robin, one iteration each per round, with the `analysis` ruleset
    saturated after every step (new terms get their shapes before any rule guards on them)."""

    rulesets: tuple[str, ...] = ALGEBRA_RULESETS
    # iterations of a ruleset per step (per egglog call, between budget checks): more for
    # rulesets that need many cheap iterations (the adjoint expansion of a deep program). The
    # driver starts at one and doubles up to `step` while steps change the e-graph: egglog's
    # `repeat` runs all its iterations, changed or not (64 for a 3-iteration expansion)
    step: int = 1

    @classmethod
    def default(cls) -> Schedule:
        return cls(ALGEBRA_RULESETS + (DEFAULT,))

    def with_rulesets(self, names) -> Schedule:
        extra = tuple(n for n in names if n not in self.rulesets and n != "analysis")
        return Schedule(self.rulesets + extra, self.step)

    def __str__(self) -> str:
        return " -> ".join(n or "(default)" for n in self.rulesets)


_RULESET = re.compile(r"\(\s*ruleset\s+([^\s()]+)\s*\)")


def rulesets_in(text: str) -> list[str]:
    """Names of the rulesets a rule file declares, in order."""
    return _RULESET.findall(text)
