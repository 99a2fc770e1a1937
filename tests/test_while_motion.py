"""Loop motion out of `while` loops (rules/loops.egg's Once rules; egraph/loop_motion.py ties
a while body's `with` operands and computes what it lifts before the loop). A while loop may
run zero times: speculatable values (elementwise, layout, cast, slice: total, one pass) move
before it as they are; a product or a reduction moves only under a `cond` on the loop's test
at its initial carries. Each fires where it should, not where it must not, and keeps the
float64 interpreter's result, at zero, one and many steps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_loop_rules import BINARY, UNARY, step_ops
from test_loop_rules_nested import _ops, _optimized, _traced

import dlvm_eq as dq
from dlvm_eq.egraph.loop_motion import speculatable
from dlvm_eq.ir import interpret

RNG = np.random.default_rng(11)


def _while(fn):
    (w,) = _ops(fn, "while")
    return w


def _same(m0, m1, name, args, tol=1e-9):
    args = [np.asarray(a, np.float64) if np.asarray(a).dtype.kind == "f" else a for a in args]
    got, want = interpret(m1, name, *args), interpret(m0, name, *args)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * (1 + np.abs(want).max()))


def product_in_loop(w, v, h0, n):
    def body(c):
        i, h = c
        return i + 1, h * 0.5 + dq.tanh(w @ v)

    return dq.while_loop(lambda c: c[0] < n, body, (0, h0))[1]


def _product_args(n):
    return (
        RNG.standard_normal((3, 4)).astype(np.float32),
        RNG.standard_normal(4).astype(np.float32),
        RNG.standard_normal(3).astype(np.float32),
        np.int32(n),
    )


@pytest.mark.parametrize("n", [0, 1, 5])
def test_an_invariant_product_moves_before_the_loop_under_its_test(n):
    args = _product_args(n)
    m0, fn = _traced(product_in_loop, *args)
    m1, new, report = _optimized(fn)
    assert "once-dot" in report and "once-tanh" in report
    loop = _while(new)
    body = loop.attrs["body"]
    assert not _ops(body, "dot") and not _ops(body, "tanh")
    # guarded: a cond whose selector is the loop's test at the initial carries
    (guard,) = _ops(new, "cond")
    assert guard.operands[0].type.dtype.name == "bool"
    test = next(i for i in new.body if i.result is guard.operands[0])
    assert test.op == "lessThan" and test.operands[1] is new.params[3]  # i < n at i = 0
    taken, skipped = guard.attrs["branches"]
    assert _ops(taken, "dot") and not _ops(skipped, "dot")
    assert any(o is guard.result or _from(new, o, guard) for o in loop.operands)
    # the test takes the new operands too, and reads none of them
    assert len(loop.attrs["cond"].params) == len(body.params) == len(loop.operands)
    _same(m0, m1, "product_in_loop", args)


def _from(fn, value, inst) -> bool:
    made = next((i for i in fn.body if i.result is value), None)
    return made is not None and made.op == "extract" and made.operands[0] is inst.result


def test_speculatable_values_move_before_the_loop_unguarded():
    def f(w, h0, n):
        def body(c):
            i, h = c
            return i + 1, h * dq.tanh(w * 2.0) + dq.sigmoid(w).T[0]

        return dq.while_loop(lambda c: c[0] < n, body, (0, h0))[1]

    args = (
        RNG.standard_normal((3, 3)).astype(np.float32),
        RNG.standard_normal((3, 3)).astype(np.float32),
        np.int32(4),
    )
    m0, fn = _traced(f, *args)
    m1, new, report = _optimized(fn)
    assert "once-tanh" in report
    body = _while(new).attrs["body"]
    assert not _ops(body, "tanh") and not _ops(body, "sigmoid")
    assert not _ops(new, "cond")  # nothing that needs the test's guard
    assert _ops(new, "tanh") and _ops(new, "sigmoid")
    for n in (0, 1, 4):
        _same(m0, m1, "f", (*args[:2], np.int32(n)))


def test_values_read_from_a_carry_stay_in_the_loop():
    def f(u, h0, n):
        def body(c):
            i, h = c
            return i + 1, dq.tanh(h @ u) + h * 0.5

        return dq.while_loop(lambda c: c[0] < n, body, (0, h0))[1]

    args = (
        RNG.standard_normal((3, 3)).astype(np.float32),
        RNG.standard_normal(3).astype(np.float32),
        np.int32(3),
    )
    m0, fn = _traced(f, *args)
    m1, new, report = _optimized(fn)
    assert "once-dot" not in report and "once-tanh" not in report
    loop = _while(new)
    assert len(loop.operands) == len(_while(fn).operands)
    assert _ops(loop.attrs["body"], "dot") and not _ops(new, "cond")
    _same(m0, m1, "f", args)


def test_speculatable_is_decided_by_the_ops_kind():
    def cheap(w):
        return dq.tanh(w * 2.0).T

    def costly(w):
        return dq.sum(w @ w)

    w = RNG.standard_normal((3, 3)).astype(np.float32)
    assert speculatable(_traced(cheap, w)[1])
    assert not speculatable(_traced(costly, w)[1])


def test_a_while_loop_with_motion_runs_compiled_equal_to_the_interpreter():
    for n in (0, 3):
        args = _product_args(n)
        m0, _ = _traced(product_in_loop, *args)
        got = dq.jit(product_in_loop)(*args)
        want = interpret(m0, "product_in_loop", *args)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- random while bodies


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(step_ops, st.sampled_from([0, 1, 4]), st.integers(0, 2**16))
def test_random_while_bodies_keep_the_interpreters_result(ops, n, seed):
    """Bodies over a carry h and invariants W, U, c: products v @ U (invariant where v is),
    elementwise ops of all; optimized with the loop-motion rules, run by the interpreter in
    float64 at 0, 1 and 4 steps, equal to the original."""

    def f(w, u, c, h0, n):
        def body(carry):
            i, h = carry
            vals = [h, w, c]
            for kind, k, a, b in ops:
                va, vb = vals[a % len(vals)], vals[b % len(vals)]
                if kind == 0:
                    vals.append(UNARY[k](va))
                elif kind == 1:
                    vals.append(BINARY[k](va, vb))
                else:
                    vals.append(va @ u)
            return i + 1, dq.tanh(vals[-1] + h)

        return dq.while_loop(lambda carry: carry[0] < n, body, (0, h0))[1]

    rng = np.random.default_rng(seed)
    args = [
        rng.standard_normal(4),
        rng.standard_normal((4, 4)) * 0.5,
        rng.standard_normal(4),
        rng.standard_normal(4),
    ]
    m0, fn = _traced(f, *[a.astype(np.float32) for a in args], np.int32(n))
    m1, _, _ = _optimized(fn)
    _same(m0, m1, "f", [*args, np.int32(n)])
