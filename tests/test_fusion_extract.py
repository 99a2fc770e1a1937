"""Fusion decided by extraction: costs decide what is materialized, the greedy extractor meets
the exhaustive optimum on small random programs, and the plan shows the decision."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_programs import random_function

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.planning.plan import TEMP
from dlvm_eq.egraph.fusion_decision import decide_fusion
from dlvm_eq.extract.machine import Machine
from dlvm_eq.ir import interpret
from dlvm_eq.ir.inline import flatten
from dlvm_eq.pipeline import compile, plan_function

RNG = np.random.default_rng(0)
NO_LAUNCH = Machine("no-launch", bandwidth=40e9, flop_rate=100e9, blas_rate=300e9, launch=0.0)
SLOW_MATH = Machine("slow-math", bandwidth=40e9, flop_rate=2e9, blas_rate=300e9, launch=1e-7)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _module(fn, *args):
    return dq.make_ir(fn)(*args)


def _flat(module):
    name = next(iter(module.functions))
    return flatten(module[name], module)


def _values(flat, op):
    return [i.result for i in flat.body if i.op == op]


def _agrees(module, *args):
    name = next(iter(module.functions))
    got = compile(module, name, optimize=False)(*args)
    want = interpret(module, name, *args, float64=True)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_an_expensive_value_read_by_several_kernels_is_materialized_a_cheap_one_recomputed():
    x = RNG.standard_normal((512, 512)).astype(np.float32)

    def f(x, op):  # t read by two reductions (two kernels) and the returned product
        t = op(x)
        return t * dq.sum(t, axis=1, keepdims=True) + dq.max(t, axis=0)

    costly = _module(lambda x: f(x, lambda v: dq.exp(dq.log(v * v + 1.0))), x)
    cheap = _module(lambda x: f(x, lambda v: v + 1.0), x)
    flat = _flat(costly)
    d = decide_fusion(flat)
    (log,) = _values(flat, "log")
    assert id(_values(flat, "exp")[0]) in d.materialize and id(log) not in d.materialize
    assert d.report.materialized == 1 and d.report.cost < d.report.cost_unfused
    flat = _flat(cheap)
    d = decide_fusion(flat)
    (add,) = [v for v in _values(flat, "add") if v.type.shape == (512, 512)][:1]
    assert id(add) not in d.materialize and d.report.materialized == 0
    plan = plan_function(costly[next(iter(costly.functions))], costly, rows=False)
    assert len([s for s in plan.slots if s.role == TEMP and s.shape == (512, 512)]) == 1
    _agrees(costly, x)


def test_a_huge_broadcast_read_is_not_expanded():
    v = RNG.standard_normal((4096,)).astype(np.float32)
    m = RNG.standard_normal((256, 4096)).astype(np.float32)
    # exp(tanh(v)) read by one kernel, through a broadcast to 256 rows: stored, not recomputed
    mod = _module(lambda v, m: dq.exp(dq.tanh(v)) * m, v, m)
    flat = _flat(mod)
    d = decide_fusion(flat)
    (e,) = _values(flat, "exp")
    assert id(e) in d.materialize and d.report.materialized == 1
    # the same value read at its own size by one kernel is inlined
    mod2 = _module(lambda v, w: dq.exp(dq.tanh(v)) * w, v, v)
    flat2 = _flat(mod2)
    (e2,) = _values(flat2, "exp")
    assert id(e2) not in decide_fusion(flat2).materialize
    _agrees(mod, v, m)


def test_a_kernel_reading_a_materialized_value_does_not_recompute_it():
    x = RNG.standard_normal((1024, 256)).astype(np.float32)
    mod = _module(lambda x: (dq.exp(dq.sin(x)) * 2.0, dq.exp(dq.sin(x)) + 1.0), x)
    plan = plan_function(mod[next(iter(mod.functions))], mod)
    # both results in one multi-output kernel, exp(sin(x)) computed once per element
    assert len(plan.kernels) == 1 and len(plan.kernels[0].outputs) == 2
    assert "fusion:" in str(plan) and "materialized" in str(plan)


SETTINGS = dict(
    deadline=None,
    derandomize=True,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@settings(**SETTINGS)
@given(st.data())
def test_greedy_extraction_meets_the_exhaustive_optimum_on_small_programs(data):
    fn = random_function(data.draw, n_ops=data.draw(st.integers(3, 14)), max_dim=64)
    flat = flatten(fn, None)
    for machine in ("cpu", NO_LAUNCH, SLOW_MATH):
        greedy = decide_fusion(flat, machine)
        if greedy.report.values - greedy.report.forced > 12:
            continue
        best = decide_fusion(flat, machine, method="exhaustive")
        assert best.report.cost <= greedy.report.cost * (1 + 1e-9) + 1e-15
        assert greedy.report.cost <= best.report.cost * (1 + 1e-9) + 1e-15, (
            f"greedy {greedy.report} vs optimum {best.report}"
        )
        assert greedy.report.cost <= greedy.report.cost_unfused * (1 + 1e-9) + 1e-15
