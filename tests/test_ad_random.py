"""Gradients of random well-typed programs (tests/ir_programs.py: broadcasting, reductions, dot,
layout, casts, compare/select) against float64 central differences; second order on a few."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_programs import functions, random_inputs
from test_adjoint_rules import fd_check, fd_check2

from dlvm_eq.ir import F64

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _float_params(fn):
    return any(p.type.dtype.is_float for p in fn.params)


@settings(max_examples=40, **SETTINGS)
@given(functions(n_ops=10, dtype=F64), st.integers(0, 2**31))
def test_random_program_gradients(fn, seed):
    if not _float_params(fn):
        return
    rng = np.random.default_rng(seed)
    fd_check(fn, random_inputs(fn, rng, float64=True), rng=rng, rtol=1e-5)


@settings(max_examples=10, **SETTINGS)
@given(functions(n_ops=6, dtype=F64), st.integers(0, 2**31))
def test_random_program_second_order(fn, seed):
    if not _float_params(fn):
        return
    rng = np.random.default_rng(seed)
    fd_check2(fn, random_inputs(fn, rng, float64=True), rng)
