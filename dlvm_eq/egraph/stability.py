"""Numerical stability outranks the cost model: a program that a stability rewrite changed is
kept even where the cost model prices it higher than the program as written.

rules/algebra.egg names those rewrites "stable: ..." (its `stable` ruleset); each subsumes the
unstable e-node, so the extracted program no longer holds it.

    >>> stabilized({"stable: log(sigmoid z)": 1, "x+0": 2}), stabilized({"x+0": 2})
    (True, False)
"""

from __future__ import annotations

from collections.abc import Mapping

STABLE_RULE_PREFIX = "stable: "


def stabilized(rule_matches: Mapping[str, int]) -> bool:
    """Whether any numerical-stability rewrite matched during saturation."""
    return any(name.startswith(STABLE_RULE_PREFIX) and n > 0 for name, n in rule_matches.items())


def stable_rules_fired(rule_matches: Mapping[str, int]) -> list[str]:
    """The stability rewrites that matched, by name, for the report."""
    return sorted(
        name for name, n in rule_matches.items() if name.startswith(STABLE_RULE_PREFIX) and n > 0
    )
