"""Transposes fold into GEMM operand flags, forward and adjoint: an MLP's gradient program runs
every product as one BLAS call, transposed operands read through views (x.T), and no transpose
is ever copied; the compiled gradient agrees with the interpreter."""

from __future__ import annotations

import numpy as np

import dlvm_eq as dq
from dlvm_eq.ad.driver import adjoint_function
from dlvm_eq.codegen.planning.plan import CopyStep
from dlvm_eq.ir import Module, interpret
from dlvm_eq.models import mlp


def _plan_steps(compiled):
    return list(compiled.plan.steps)


def test_mlp_gradient_has_no_standalone_transpose():
    params = mlp.init_params([20, 16, 5], seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 20)).astype(np.float32)
    y = np.eye(5, dtype=np.float32)[rng.integers(0, 5, 8)]
    fn = dq.make_ir(mlp.loss)(*params, x, y)["loss"]
    g = adjoint_function(None, fn, wrt=(0, 1, 2, 3), keeping=(0,), tuple_result=True)
    m = Module("mlp")
    m.add(g)
    compiled = dq.compile(m, g.name)
    steps = _plan_steps(compiled)
    assert len(compiled.plan.blas_calls) == 5, compiled.plan  # 2 forward, 3 backward products
    assert not any(isinstance(s, CopyStep) for s in steps), compiled.plan
    # the three backward products read x^T, h^T and w2^T as transposed views
    assert str(compiled.plan).count(".T") == 3, compiled.plan
    want = interpret(m, g.name, *params, x, y, float64=True)
    for got, w in zip(compiled(*params, x, y), want):
        np.testing.assert_allclose(got, w, rtol=2e-4, atol=1e-6)


def test_redundant_transposes_in_a_forward_program_fold():
    def f(x, w, v):
        return ((x.T).T @ w.T) @ v.T.T

    rng = np.random.default_rng(1)
    x, w, v = (rng.standard_normal(s).astype(np.float32) for s in ((6, 4), (5, 4), (5, 3)))
    m = dq.make_ir(f)(x, w, v)
    compiled = dq.compile(m, "f")
    steps = _plan_steps(compiled)
    assert len(compiled.plan.blas_calls) == 2 and len(steps) == 2, compiled.plan
    np.testing.assert_allclose(compiled(x, w, v), (x @ w.T) @ v, rtol=1e-4)
