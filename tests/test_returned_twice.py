"""A value returned twice (codegen/execution/output_buffers.returned_twice): the plan copies
one output into the other, and the CPU program skips that copy and returns the one buffer twice,
as Python returns `y, y`. Results still equal the float64 interpreter, a later call never
overwrites what an earlier one returned, and an argument returned is still copied."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.execution.executor import program
from dlvm_eq.codegen.execution.output_buffers import returned_twice
from dlvm_eq.codegen.planning.plan import CopyStep
from dlvm_eq.ir import interpret
from dlvm_eq.pipeline import plan_function


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


X = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)


def _compiled(fn, *args):
    m = dq.make_ir(fn)(*args)
    name = next(iter(m.functions))
    plan = plan_function(m[name], m)
    return m, name, plan, program(plan)


def test_a_value_returned_twice_is_one_buffer_and_no_copy():
    m, name, plan, prog = _compiled(lambda x: (dq.exp(x) * 2.0, dq.exp(x) * 2.0, dq.tanh(x)), X)
    copies, same = returned_twice(plan)
    assert len(copies) == 1 and all(isinstance(plan.steps[i], CopyStep) for i in copies), plan
    assert len(prog._runs) == len(plan.steps) - 1  # the copy is not run
    a, b, c = prog(X)
    assert a is b and c is not a
    want = interpret(m, name, X, float64=True)
    for got, w in zip((a, b, c), want):
        np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-6)
    a2, b2, _ = prog(X * 0.5)  # the first call's results are held: fresh buffers
    assert a2 is b2 and a2 is not a
    np.testing.assert_allclose(a, want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(a2, np.exp(X.astype(np.float64) * 0.5) * 2, rtol=1e-6)


def test_an_argument_returned_twice_is_still_copied():
    _, _, plan, prog = _compiled(lambda x: (x, x), X)
    assert returned_twice(plan) == (set(), {})
    a, b = prog(X)
    assert a is not X and b is not X
    np.testing.assert_array_equal(a, X)
    np.testing.assert_array_equal(b, X)
