"""Matrix chains: extraction under the target cost model finds the dynamic-programming optimum."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shipped_cost_model import shipped_cost_model  # noqa: F401 - autouse: the shipped cost model

import dlvm_eq as dq
from dlvm_eq.egraph.query import query
from dlvm_eq.ir import F64, FunctionBuilder, Module, interpret, tensor, verify

TEXTBOOK = (30, 35, 15, 5, 10, 20, 25)  # CLRS 15.2: the optimum is 15,125 multiplications


def dp_optimum(dims) -> int:
    """Fewest scalar multiplications for the chain with these dimensions (CLRS)."""
    n = len(dims) - 1

    @lru_cache(None)
    def best(i, j):
        if i == j:
            return 0
        return min(
            best(i, k) + best(k + 1, j) + dims[i] * dims[k + 1] * dims[j + 1] for k in range(i, j)
        )

    return best(0, n - 1)


def chain_module(dims, order: str = "left") -> Module:
    n = len(dims) - 1
    b = FunctionBuilder(
        "chain", [tensor(dims[i], dims[i + 1], F64) for i in range(n)], [f"A{i}" for i in range(n)]
    )
    ps = list(b.params)
    if order == "left":
        v = ps[0]
        for p in ps[1:]:
            v = b.emit("dot", [v, p])
    else:
        v = ps[-1]
        for p in reversed(ps[:-1]):
            v = b.emit("dot", [p, v])
    m = Module("chains")
    m.add(b.finish(v))
    return m


def multiplies(fn) -> int:
    return sum(
        i.operands[0].type.shape[0] * i.operands[0].type.shape[1] * i.operands[1].type.shape[1]
        for i in fn.body
        if i.op == "dot"
    )


def test_textbook_chain():
    m = chain_module(TEXTBOOK)
    r = dq.optimize(m, never_slower=False)  # the e-graph's optimum, not the guard's choice
    assert multiplies(m["chain"]) == 40_500  # left to right as written
    assert multiplies(r.module["chain"]) == dp_optimum(TEXTBOOK) == 15_125
    assert r.cost_after < r.cost_before
    assert r.report["chain"].saturation.stop_reason == "saturated"


def test_textbook_chain_query():
    shapes = {f"A{i}": (TEXTBOOK[i], TEXTBOOK[i + 1]) for i in range(6)}
    r = query(" @ ".join(shapes), shapes)
    assert r.original.multiplies == 40_500
    assert r.best.multiplies == 15_125
    assert r.best.text == "A0 @ (A1 @ A2) @ (A3 @ A4 @ A5)"
    assert all(a.cost >= r.best.cost and a.multiplies > 15_125 for a in r.alternatives)


@settings(
    max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(st.integers(1, 100), min_size=3, max_size=13), st.sampled_from(["left", "right"]))
def test_random_chains_reach_the_dp_optimum(dims, order):
    m = chain_module(dims, order)
    # optimality is the rules' and the extractor's property, not the machine's speed: a
    # time budget a loaded core can eat would stop saturation short (seen: 1870890 vs 1440240)
    r = dq.optimize(m, budget={"seconds": 120}, never_slower=False)
    fn = r.module["chain"]
    verify(r.module)
    assert multiplies(fn) == dp_optimum(tuple(dims))
    args = [np.random.default_rng(0).standard_normal(p.type.shape) for p in fn.params]
    want = interpret(m, "chain", *args, float64=True)
    np.testing.assert_allclose(
        interpret(r.module, "chain", *args, float64=True),
        want,
        rtol=1e-9,
        atol=1e-9 * np.abs(want).max(),
    )


@pytest.mark.parametrize("dims", [(10, 2, 30, 3, 40), (5, 50, 5, 50, 5, 50)])
def test_ilp_extraction_agrees(dims):
    r = dq.optimize(chain_module(dims), extractor="ilp", never_slower=False)
    assert multiplies(r.module["chain"]) == dp_optimum(dims)
