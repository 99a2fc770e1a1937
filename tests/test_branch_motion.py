"""Values every branch of a cond or switch computes from the same operands move before it
(ir/branch_motion.py, run by dq.optimize after the e-graph); a value only one branch needs
stays in it. Checked against the float64 interpreter on both branches and on random
branches (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.ir import Module, interpret, verify
from dlvm_eq.ir.branch_motion import hoist_branch_common
from dlvm_eq.ir.control_flow import module_with_bodies

RNG = np.random.default_rng(3)


def _traced(f, *args):
    m = dq.make_ir(f)(*args)
    return m, next(iter(m.functions.values()))


def _module(fn):
    m = Module("t")
    module_with_bodies(m, fn)
    verify(m)
    return m


def _ops(fn, op):
    return [i for i in fn.body if i.op == op]


def _same(m0, m1, name, args):
    args = [np.asarray(a, np.float64) if np.asarray(a).dtype.kind == "f" else a for a in args]
    got, want = interpret(m1, name, *args), interpret(m0, name, *args)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def shared_product(p, w, v):
    return dq.cond(
        p,
        lambda w, v: dq.tanh(w @ v) + 1.0,
        lambda w, v: dq.tanh(w @ v) * v[0:3] + dq.exp(v[0:3]),
        w,
        v,
    )


def _args(p):
    return (
        np.bool_(p),
        RNG.standard_normal((3, 4)).astype(np.float32),
        RNG.standard_normal(4).astype(np.float32),
    )


def test_a_value_both_branches_compute_moves_before_the_cond_and_one_branchs_stays():
    m0, fn = _traced(shared_product, *_args(True))
    new = hoist_branch_common(fn)
    m1 = _module(new)
    assert [i.op for i in new.body[:2]] == ["dot", "tanh"]  # computed once, before the cond
    (c,) = _ops(new, "cond")
    taken, other = c.attrs["branches"]
    assert not _ops(taken, "dot") and not _ops(other, "dot") and not _ops(other, "tanh")
    assert _ops(other, "exp") and not _ops(new, "exp")  # only one branch needs it: it stays
    assert len(taken.params) == len(other.params) == len(c.operands) - 1
    for p in (True, False):
        _same(m0, m1, "shared_product", _args(p))


def test_values_of_different_operands_do_not_move():
    def f(p, a, b):  # tanh(a) and tanh(b): the same op, other operands
        return dq.cond(p, lambda a, b: dq.tanh(a), lambda a, b: dq.tanh(b), a, b)

    args = (np.bool_(True), *RNG.standard_normal((2, 3)).astype(np.float32))
    _, fn = _traced(f, *args)
    assert hoist_branch_common(fn) is fn


def test_a_switch_moves_what_all_its_branches_compute_and_only_that():
    def f(k, a):
        return dq.switch(
            k,
            [lambda a: dq.exp(a) + 1.0, lambda a: dq.exp(a) * 2.0, lambda a: dq.exp(a) - a],
            a,
        )

    args = (np.int32(1), RNG.standard_normal(3).astype(np.float32))
    m0, fn = _traced(f, *args)
    new = hoist_branch_common(fn)
    m1 = _module(new)
    assert [i.op for i in new.body].count("exp") == 1
    (s,) = _ops(new, "switch")
    assert all(not _ops(b, "exp") for b in s.attrs["branches"])
    for k in (-1, 0, 1, 2, 5):
        _same(m0, m1, "f", (np.int32(k), args[1]))

    def g(k, a):  # two of three branches share exp(a): the third would pay for it
        return dq.switch(
            k, [lambda a: dq.exp(a) + 1.0, lambda a: dq.exp(a) * 2.0, lambda a: a - 1.0], a
        )

    _, fn = _traced(g, *args)
    assert hoist_branch_common(fn) is fn


def test_dq_optimize_moves_a_shared_value_out_of_a_cond_inside_a_scan():
    def f(w, h0, xs):
        def step(h, x):
            y = dq.cond(x[0] > 0.0, lambda h: dq.tanh(h @ w) + h, lambda h: dq.tanh(h @ w), h)
            return y, y

        return dq.scan(step, h0, xs)

    args = (
        RNG.standard_normal((3, 3)).astype(np.float32),
        RNG.standard_normal(3).astype(np.float32),
        RNG.standard_normal((5, 3)).astype(np.float32),
    )
    m0, fn = _traced(f, *args)
    m = Module("t")
    module_with_bodies(m, fn)
    res = dq.optimize(m, fn.name)
    verify(res.module)
    body = _ops(res.module[fn.name], "scan")[0].attrs["body"]
    (c,) = _ops(body, "cond")
    assert all(not _ops(b, "dot") for b in c.attrs["branches"]) and _ops(body, "dot")
    got, want = interpret(res.module, "f", *args), interpret(m0, "f", *args)
    for g_, w_ in zip(got, want):
        np.testing.assert_allclose(g_, w_, rtol=1e-5, atol=1e-5)


UNARY = [dq.tanh, dq.sigmoid, lambda v: v * 0.5]
BINARY = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a @ b]
prog = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(0, 9), st.integers(0, 9)),
    min_size=1,
    max_size=5,
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(prog, prog, st.integers(0, 2**16))
def test_random_branches_keep_the_interpreters_result(left, right, seed):
    """Two branches built from the same random ops over (a, b), sharing a prefix or not;
    moved, each branch run by the float64 interpreter equals the original."""

    def branch(ops):
        def run(a, b):
            vals = [a, b]
            for kind, k, i, j in ops:
                x, y = vals[i % len(vals)], vals[j % len(vals)]
                vals.append(UNARY[k](x) if kind == 0 else BINARY[k](x, y))
            return vals[-1] + a

        return run

    def f(p, a, b):
        return dq.cond(p, branch(left), branch(left[:1] + right), a, b)

    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    m0, fn = _traced(f, np.bool_(True), a.astype(np.float32), b.astype(np.float32))
    m1 = _module(hoist_branch_common(fn))
    for p in (True, False):
        _same(m0, m1, "f", (np.bool_(p), a, b))


def test_two_moved_values_reach_each_branch_in_their_places():
    def f(p, a):
        return dq.cond(
            p,
            lambda a: dq.exp(a) - dq.tanh(a),
            lambda a: dq.tanh(a) * 2.0 + dq.exp(a) * 3.0,
            a,
        )

    args = (np.bool_(True), RNG.standard_normal(3).astype(np.float32))
    m0, fn = _traced(f, *args)
    new = hoist_branch_common(fn)
    (c,) = _ops(new, "cond")
    assert len(c.operands) == 4  # p, a, exp(a), tanh(a)
    m1 = _module(new)
    for p in (True, False):
        _same(m0, m1, "f", (np.bool_(p), args[1]))
