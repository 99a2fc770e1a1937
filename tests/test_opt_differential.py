"""Differential: optimized programs compute what the originals compute (reference interpreter,
float64, tight tolerance), on hypothesis-generated programs of every op kind.

Programs are f64 so that constant folding (done in f64) is exact; folding an f32 program's
constants rounds them to f32 once, as running it in f32 would, but the float64 oracle does not."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_programs import random_function, random_inputs

import dlvm_eq as dq
from dlvm_eq.egraph.stability import stable_rules_fired
from dlvm_eq.ir import F32, F64, I32, Module, interpret, verify
from dlvm_eq.ir.ops import BINARY, DOT, LAYOUT, REDUCE, SLICE, UNARY

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _check(fn, float64: bool = True, rtol: float = 1e-9):
    m = Module("random")
    m.add(fn)
    result = dq.optimize(m, budget={"seconds": 2.0})
    verify(result.module)
    # never dearer, except where a numerical-stability rewrite outranks the cost model
    assert result.cost_after <= result.cost_before or any(
        stable_rules_fired(f.saturation.rule_matches) for f in result.report if f.saturation
    )
    rng = np.random.default_rng(0)
    for _ in range(2):
        args = random_inputs(fn, rng, float64=float64)
        want = interpret(m, fn.name, *args, float64=float64)
        got = interpret(result.module, fn.name, *args, float64=float64)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        assert len(want) == len(got)
        for w, g in zip(want, got):
            assert w.shape == g.shape and w.dtype == g.dtype
            np.testing.assert_allclose(
                g,
                w,
                rtol=rtol,
                atol=rtol,
                equal_nan=True,
                err_msg=f"\n{fn}\n---- optimized:\n{result.module[fn.name]}",
            )
    return result


@settings(max_examples=30, **SETTINGS)
@given(st.data())
def test_random_programs_of_every_kind(data):
    _check(random_function(data.draw, n_ops=24, dtype=F64))


@settings(max_examples=25, **SETTINGS)
@given(st.data())
def test_random_linear_algebra_programs(data):
    """Matmuls, transposes, reductions and arithmetic: the algebra rules' home ground."""
    fn = random_function(
        data.draw, n_ops=22, dtype=F64, kinds=(DOT, LAYOUT, SLICE, REDUCE, BINARY, UNARY), max_dim=5
    )
    _check(fn)


@settings(max_examples=10, **SETTINGS)
@given(st.data())
def test_random_f32_programs(data):
    """f32 programs: folded constants are rounded to f32 once (tolerance of f32 rounding)."""
    _check(random_function(data.draw, n_ops=24, dtype=F32), rtol=1e-6)


@settings(max_examples=10, **SETTINGS)
@given(st.data())
def test_random_integer_programs(data):
    _check(random_function(data.draw, n_ops=20, dtype=I32), float64=False)
