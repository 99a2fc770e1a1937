"""E-graph checks shared by the layout rule tests (test_conv_layout.py, test_conv1d_taps.py,
test_batched_product_forms.py): variables of given shapes and dtypes, a term saturated with
rules/layout.egg's `transpose` ruleset, and whether its class then holds a node of a pattern."""

from __future__ import annotations

from dlvm_eq.egraph import RuleFileError
from dlvm_eq.egraph.lets import egg_vec
from dlvm_eq.egraph.optimize import scratch_session
from dlvm_eq.egraph.ruleset_schedule import Budget, Schedule
from dlvm_eq.egraph.saturate import saturate


def vec(*xs) -> str:
    return egg_vec(xs)


def declarations(shapes: dict[str, tuple[tuple[int, ...], str]]) -> str:
    """`$name` for each variable, with its shape and dtype set as the loader sets them."""
    return "".join(
        f'(let ${n} (Var "{n}")) (set (shape ${n}) {vec(*s)}) (set (dtype ${n}) "{d}")\n'
        for n, (s, d) in shapes.items()
    )


def equal_after(decls: str, term: str, expected: str, iterations: int = 3) -> bool:
    """Whether `term` and `expected` share an e-class after the `transpose` ruleset (an
    `expected` with ?variables: whether term's class holds such a node)."""
    with scratch_session() as s:
        s.run_text(decls + f"(let $t {term})")
        if "?" not in expected:
            s.run_text(f"(let $e {expected})")
        saturate(s, Schedule(("transpose",)), Budget(iterations=iterations))
        try:
            s.run_text(f"(check (= $t {expected if '?' in expected else '$e'}))")
            return True
        except RuleFileError:
            return False
