"""Loop motion (rules/loops.egg's Once/StepOf) for scan bodies of several pieces (cut by a
cond or a scan inside them) and for scans nested in scan bodies (egraph/loop_motion.py): what
is the same at every step moves before the scan, and before the outer scan where it is the
same at every outer step too; what reads a carry, another piece's result or an outer row
stays. Checked against the interpreter in float64 and, for gradients, the unrolled program."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.ir import Module, interpret, verify
from dlvm_eq.ir.control_flow import module_with_bodies

RNG = np.random.default_rng(17)


def _traced(f, *args):
    m = dq.make_ir(f)(*args)
    return m, next(iter(m.functions.values()))


def _optimized(fn):
    m = Module("t")
    module_with_bodies(m, fn)
    res = dq.optimize(m, fn.name)
    verify(res.module)
    return res.module, res.module[fn.name], str(res.report)


def _ops(fn, op):
    return [i for i in fn.body if i.op == op]


def _body(fn):
    (scan,) = _ops(fn, "scan")
    return scan.attrs["body"]


def _same(m0, m1, name, args, tol=1e-9):
    args = [np.asarray(a, np.float64) if not isinstance(a, bool) else a for a in args]
    got = interpret(m1, name, *args, float64=True)
    want = interpret(m0, name, *args, float64=True)
    for g, w in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want))):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * max(1.0, np.abs(w).max()))


def _f32(*shapes):
    return [RNG.standard_normal(s).astype(np.float32) for s in shapes]


# ---------------------------------------------------------------- several pieces
def around_a_cond(w, v, h0, xs, p):
    def step(h, x):
        a = dq.tanh(w @ v) * h  # tanh(w @ v): invariant, in the piece before the cond
        b = dq.cond(p, lambda z: z * 2.0, lambda z: z - 1.0, a)
        return b + dq.sigmoid(w @ v) + x, b  # sigmoid(w @ v): invariant, in the piece after

    return dq.scan(step, h0, xs)


def test_invariants_on_both_sides_of_a_cond_in_a_body_move_before_the_loop():
    args = [*_f32((3, 4), 4, 3, (5, 3)), True]
    m0, fn = _traced(around_a_cond, *args)
    m1, new, report = _optimized(fn)
    assert "once-tanh" in report and "once-sigmoid" in report
    body = _body(new)
    assert not _ops(body, "dot") and not _ops(body, "tanh") and not _ops(body, "sigmoid")
    assert len(_ops(body, "cond")) == 1  # the cond stays, on a carry's value
    assert len(_ops(new, "tanh")) == 1 and len(_ops(new, "sigmoid")) == 1
    assert len(_ops(new, "dot")) == 1  # both pieces lifted w @ v: computed once before the loop
    for p in (True, False):
        _same(m0, m1, "around_a_cond", [*args[:4], p])


def test_a_pieces_value_from_the_cond_or_a_carry_stays_in_the_body():
    def f(w, h0, xs, p):
        def step(h, x):
            b = dq.cond(p, lambda z: z * 2.0, lambda z: z + 1.0, x)  # per step: a row
            return dq.tanh(b @ w) + h @ w, h  # b @ w reads the cond's result: it stays

        return dq.scan(step, h0, xs)

    args = [*_f32((3, 3), 3, (4, 3)), False]
    m0, fn = _traced(f, *args)
    m1, new, report = _optimized(fn)
    assert "batch-step" not in report
    assert len(_ops(_body(new), "dot")) == 2 and not _ops(new, "dot")
    _same(m0, m1, "f", args)


# ---------------------------------------------------------------- nested scans
def nested(w, v, h0, xss):
    def outer(h, xs):
        def inner(g, x):
            return g * x + dq.tanh(w @ v), g  # invariant in both loops

        g, _ = dq.scan(inner, h, xs)
        return g, g

    return dq.scan(outer, h0, xss)


def test_an_inner_invariant_of_outer_invariants_moves_before_the_outer_scan():
    args = _f32((3, 4), 4, 3, (4, 5, 3))
    m0, fn = _traced(nested, *args)
    m1, new, report = _optimized(fn)
    assert "once-dot" in report
    outer = _body(new)
    inner = _body(outer)
    assert [len(_ops(g, "dot")) for g in (new, outer, inner)] == [1, 0, 0]
    assert [len(_ops(g, "tanh")) for g in (new, outer, inner)] == [1, 0, 0]
    # the outer body hands the value on as a with of the inner scan
    (inner_scan,) = _ops(outer, "scan")
    assert outer.params[-1] in inner_scan.operands
    _same(m0, m1, "nested", args)


def test_an_inner_invariant_that_reads_the_outer_carry_stays_in_the_outer_body():
    def f(w, h0, xss):
        def outer(h, xs):
            def inner(g, x):
                return g * x + dq.tanh(h @ w), g  # h: the outer carry, fixed in the inner loop

            g, _ = dq.scan(inner, h, xs)
            return g, g

        return dq.scan(outer, h0, xss)

    args = _f32((3, 3), 3, (4, 5, 3))
    m0, fn = _traced(f, *args)
    m1, new, report = _optimized(fn)
    outer = _body(new)
    assert not _ops(new, "dot")  # not before the outer scan: h changes every outer step
    assert len(_ops(outer, "dot")) == 1 and not _ops(_body(outer), "dot")
    _same(m0, m1, "f", args)


def test_an_inner_batched_product_of_outer_rows_is_batched_in_the_outer_body():
    def f(w, h0, xss):
        def outer(h, xs):  # xs: an outer row, the inner scan's stacked input
            def inner(g, x):
                return dq.tanh(g + x @ w), g

            g, _ = dq.scan(inner, h, xs)
            return g, g

        return dq.scan(outer, h0, xss)

    args = _f32((3, 4), 4, (3, 6, 3))
    m0, fn = _traced(f, *args)
    m1, new, report = _optimized(fn)
    assert "batch-step-vector-product" in report
    outer = _body(new)
    assert not _ops(new, "dot") and not _ops(_body(outer), "dot")
    assert [d.result.type.shape for d in _ops(outer, "dot")] == [(6, 4)]
    _same(m0, m1, "f", args)


def test_three_levels_move_to_the_outermost_level_that_keeps_them_fixed():
    def f(w, v, h0, xsss):
        def l1(h, xss):
            def l2(g, xs):
                def l3(k, x):
                    return k * x + dq.sigmoid(w @ v), k

                k, _ = dq.scan(l3, g, xs)
                return k, k

            g, _ = dq.scan(l2, h, xss)
            return g, g

        return dq.scan(l1, h0, xsss)

    args = _f32((3, 4), 4, 3, (2, 3, 4, 3))
    m0, fn = _traced(f, *args)
    m1, new, report = _optimized(fn)
    b1 = _body(new)
    b2 = _body(b1)
    b3 = _body(b2)
    assert [len(_ops(g, "sigmoid")) for g in (new, b1, b2, b3)] == [1, 0, 0, 0]
    _same(m0, m1, "f", args)


def test_nested_motion_runs_compiled_equal_to_the_interpreter():
    args = _f32((3, 4), 4, 3, (4, 5, 3))
    m0, _ = _traced(nested, *args)
    got = dq.jit(nested)(*args)
    want = interpret(m0, "nested", *args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    args = [*_f32((3, 4), 4, 3, (5, 3)), False]
    m0, _ = _traced(around_a_cond, *args)
    got = dq.jit(around_a_cond)(*args)
    want = interpret(m0, "around_a_cond", *args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_the_gradient_of_a_nested_scan_equals_the_unrolled_programs():
    def looped(w, v, h0, xss):
        hs, ys = nested(w, v, h0, xss)
        return dq.sum(hs * hs) + dq.sum(ys)

    def unrolled(w, v, h0, xss):
        h, ys = h0, []
        for i in range(xss.shape[0]):
            g = h
            for j in range(xss.shape[1]):
                g = g * xss[i, j] + dq.tanh(w @ v)
            h = g
            ys.append(g)
        return dq.sum(h * h) + sum(dq.sum(y) for y in ys)

    args = [a.astype(np.float64) * 0.5 for a in _f32((3, 4), 4, 3, (3, 4, 3))]
    got = dq.jit(dq.grad(looped, argnums=(0, 1, 2, 3)))(*args)
    want = dq.jit(dq.grad(unrolled, argnums=(0, 1, 2, 3)))(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------- random nested bodies
from test_loop_rules import BINARY, UNARY  # noqa: E402  (the unrolled suite's op tables)

ops_ = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 9), st.integers(0, 9)),
    min_size=1,
    max_size=5,
)


def _chain(ops, vals, u):
    for kind, k, a, b in ops:
        va, vb = vals[a % len(vals)], vals[b % len(vals)]
        if kind == 0:
            vals.append(UNARY[k](va))
        elif kind == 1:
            vals.append(BINARY[k](va, vb))
        elif kind == 2:
            vals.append(va @ u)
        else:
            vals.append(dq.tanh(va) * 0.5)
    return vals[-1]


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    ops_,
    ops_,
    st.sampled_from([1, 2, 3]),
    st.sampled_from([2, 3]),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_random_nested_bodies_keep_the_interpreters_result(outer_ops, inner_ops, n, m, rev, seed):
    """An outer scan whose body runs pieces around an inner scan; both bodies chain random
    elementwise ops and products with invariants (w, u, c), the outer carry and rows; the
    optimized program, run by the interpreter in float64, equals the original."""

    def f(w, u, c, h0, xss):
        def outer(h, xs):
            a = _chain(outer_ops, [h, c, w @ c, xs[0]], u)

            def inner(g, x):
                return dq.tanh(_chain(inner_ops, [g, x, c, a, u @ c], u) + g), g

            g, ys = dq.scan(inner, h, xs, reverse=rev)
            return g + _chain(outer_ops, [g, c, a], u) * 0.25, ys[0]

        return dq.scan(outer, h0, xss)

    rng = np.random.default_rng(seed)
    args = [
        rng.standard_normal((4, 4)) * 0.5,
        rng.standard_normal((4, 4)) * 0.5,
        rng.standard_normal(4),
        rng.standard_normal(4),
        rng.standard_normal((n, m, 4)),
    ]
    m0, fn = _traced(f, *[a.astype(np.float32) for a in args])
    m1, _, _ = _optimized(fn)
    _same(m0, m1, "f", args, tol=1e-8)
