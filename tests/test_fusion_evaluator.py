"""The fusion cost evaluator (extract/fusion_cost._Evaluator.kernel, greedy fusion's hot loop)
gives exactly what its plain first version gave, kept here as the oracle: the same cost, the
same classes expanded and loaded, the same work count, for every kernel of random programs'
fusion problems under random materialized sets, and of a deep chain whose kernels reach the
expansion limit (EXPAND_LIMIT) and a softmax whose row kernel reads its own reductions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_programs import random_function

import dlvm_eq as dq
from dlvm_eq.egraph.fusion_decision import decide_fusion
from dlvm_eq.extract import fusion_cost
from dlvm_eq.extract.fusion_cost import EXPAND_LIMIT, _Evaluator
from dlvm_eq.ir.inline import flatten


def reference_kernel(p, members, mat) -> tuple[float, frozenset, frozenset, int]:
    """The evaluator as first written (before its hot loop was tuned): (cost, expanded,
    loaded, expansion steps)."""
    n = max(k.space for k in members)
    own = {k.cls for k in members}
    reduced = {k.cls for k in members if k.reduction}
    flops, read, steps = 0.0, 0.0, 0
    seen, loaded_t, expanded, loaded = set(), set(), set(), set()
    stack: list = []
    for k in members:
        stack.append(None)
        stack.append(k.body)
    depth = 0
    while stack:
        c = stack.pop()
        steps += 1
        if c is None:
            depth = 0
            continue
        if c in seen:
            continue
        seen.add(c)
        choice = None
        for t in p.loads[c]:
            if t in reduced:
                choice = None
                break
            if t in own:
                continue
            if t in p.free or t in p.buffers or t in mat:
                choice = t
                break
        if choice is None and depth >= EXPAND_LIMIT:
            horizon = next(
                (t for t in p.loads[c] if t not in own and t not in reduced and t in p.sizes),
                None,
            )
            if horizon is not None:
                elems, itemsize = p.sizes[horizon]
                read += 2 * min(elems, n) * itemsize
                continue
        if choice is None and any(t in reduced for t in p.loads[c]):
            continue
        if choice is not None:
            if choice not in loaded_t and choice not in p.free:
                loaded_t.add(choice)
                elems, itemsize = p.sizes[choice]
                read += min(elems, n) * itemsize
                if choice in p.cand_of:
                    loaded.add(choice)
            continue
        for t in p.loads[c]:
            if t in p.cand_of and t not in own:
                expanded.add(t)
        op = p.ops[c]
        flops += op[0]
        depth += 1
        stack.extend(op[1])
    mc = p.machine
    out = sum(k.out_bytes for k in members)
    inv_bw, inv_flops = 1.0 / mc.bandwidth, 1.0 / mc.flop_rate
    cost = mc.launch + (out + read) * inv_bw + flops * n * inv_flops
    return cost, frozenset(expanded), frozenset(loaded), steps


def _problems(flat) -> list:
    """The fusion problems decide_fusion hands greedy extraction for `flat`."""
    seen = []
    real = fusion_cost.greedy_fusion

    def capture(problem, *args, **kwargs):
        seen.append(problem)
        return real(problem, *args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(fusion_cost, "greedy_fusion", capture)
        decide_fusion(flat)
    return seen


def _check(p, rng) -> int:
    """Every kernel group of `p` under a few random materialized sets: evaluator == oracle.
    Returns the deepest expansion seen (to show the limit is reached where meant)."""
    cands = [k.cls for k in p.candidates]
    deepest = 0
    for _ in range(4):
        mat = {c for c in cands if rng.random() < 0.5}
        ev = _Evaluator(p)
        for members in ev.groups(mat).values():
            before = ev.steps
            got = ev.kernel(members, mat)
            cost, expanded, loaded, steps = reference_kernel(p, members, mat)
            assert got.cost == cost and got.expanded == expanded and got.loaded == loaded
            assert ev.steps - before == steps
            deepest = max(deepest, steps)
    return deepest


@settings(
    deadline=None,
    derandomize=True,
    max_examples=15,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_the_evaluator_equals_its_first_version_on_random_programs(data):
    fn = random_function(data.draw, n_ops=data.draw(st.integers(3, 12)), max_dim=32)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    for p in _problems(flatten(fn, None)):
        _check(p, rng)


def test_the_evaluator_equals_its_first_version_past_the_expansion_limit():
    def deep(x):
        for _ in range(30):
            x = dq.tanh(x * x + x)
        return dq.sum(x)

    module = dq.make_ir(dq.grad(deep))(np.linspace(-0.5, 0.5, 6).astype(np.float32))
    fn = module[next(iter(module.functions))]
    (p,) = _problems(flatten(fn, module))
    assert _check(p, np.random.default_rng(1)) > EXPAND_LIMIT


def test_the_evaluator_equals_its_first_version_on_a_row_kernel():
    def softmax(x):
        e = dq.exp(x - dq.max(x, axis=1, keepdims=True))
        return e / dq.sum(e, axis=1, keepdims=True)

    module = dq.make_ir(softmax)(np.ones((8, 16), np.float32))
    fn = module[next(iter(module.functions))]
    (p,) = _problems(flatten(fn, module))
    assert any(k.reduction for k in list(p.forced) + list(p.candidates))
    _check(p, np.random.default_rng(2))
