"""Loop rules (ir/loop_rules.py): invariant code motion out of a scan body, batching a
per-step product with an invariant into one product over all steps, constant-selector cond
folding. Each fires where it should, not where it must not, and keeps the interpreter's
result."""

from __future__ import annotations

import numpy as np

import dlvm_eq as dq
from dlvm_eq.ir import Module, interpret, verify
from dlvm_eq.ir.control_flow import module_with_bodies
from dlvm_eq.ir.loop_rules import apply_loop_rules

RNG = np.random.default_rng(5)


def _fn(f, *args):
    m = dq.make_ir(f)(*args)
    return m, next(iter(m.functions.values()))


def _rewritten(fn, batch=True):
    new = apply_loop_rules(fn, batch=batch)
    m = Module("rules")
    module_with_bodies(m, new)
    verify(m)
    return m, new


def _ops(fn, op):
    return [i for i in fn.body if i.op == op]


def _scan_body(fn):
    return _ops(fn, "scan")[0].attrs["body"]


def rnn(w, u, b, h0, xs):
    def step(h, x):
        h = dq.tanh(x @ w + b + h @ u.T)  # u.T: invariant; x @ w + b: batchable; h @ u: not
        return h, h

    return dq.scan(step, h0, xs)


def _rnn_args(rows=(4,)):
    return (
        RNG.standard_normal((3, 5)).astype(np.float32),
        RNG.standard_normal((5, 5)).astype(np.float32),
        RNG.standard_normal(5).astype(np.float32),
        RNG.standard_normal((*rows, 5)).astype(np.float32),
        RNG.standard_normal((6, *rows, 3)).astype(np.float32),
    )


def _same(m0, m1, name, args):
    for g, w in zip(interpret(m1, name, *args), interpret(m0, name, *args)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_invariant_is_hoisted_and_the_input_projection_batched():
    args = _rnn_args()
    m0, fn = _fn(rnn, *args)
    m1, new = _rewritten(fn)
    body = _scan_body(new)
    assert not _ops(body, "transpose")  # u.T computed once, before the scan
    assert len(_ops(new, "transpose")) == 1
    dots = _ops(body, "dot")
    assert len(dots) == 1 and dots[0].operands[0] is body.params[0]  # only h @ u.T stays
    outer_dots = _ops(new, "dot")
    assert len(outer_dots) == 1 and outer_dots[0].result.type.shape == (24, 5)  # 6 steps x 4
    _same(m0, m1, "rnn", args)


def test_batching_off_keeps_the_products_in_the_body():
    m0, fn = _fn(rnn, *_rnn_args())
    _, new = _rewritten(fn, batch=False)
    assert len(_ops(_scan_body(new), "dot")) == 2
    assert not _ops(new, "dot")


def test_no_rule_fires_on_carry_dependent_values():
    def f(h0, xs):
        return dq.scan(lambda h, x: (dq.tanh(h * x), h), h0, xs)

    args = (
        RNG.standard_normal(3).astype(np.float32),
        RNG.standard_normal((4, 3)).astype(np.float32),
    )
    _, fn = _fn(f, *args)
    _, new = _rewritten(fn)
    assert [i.op for i in _scan_body(new).body] == [i.op for i in _scan_body(fn).body]


def test_a_lower_rank_step_value_is_not_batched_against_a_wider_invariant():
    def f(m, xs):  # x_t: (3,), m: (2, 3): stacking x gives (T, 3), which would not broadcast
        return dq.scan(lambda c, x: (c + x * m, c), m * 0.0, xs)

    args = (
        RNG.standard_normal((2, 3)).astype(np.float32),
        RNG.standard_normal((4, 3)).astype(np.float32),
    )
    m0, fn = _fn(f, *args)
    m1, new = _rewritten(fn)
    assert _ops(_scan_body(new), "multiply")
    _same(m0, m1, "f", args)


def test_cond_on_a_constant_folds_to_the_taken_branch():
    def f(x):
        return dq.cond(True, dq.sin, dq.cos, x) + dq.switch(7, [dq.exp, dq.tanh], x)

    x = RNG.standard_normal(3).astype(np.float32)
    m0, fn = _fn(f, x)
    m1, new = _rewritten(fn)
    assert not _ops(new, "cond") and not _ops(new, "switch")
    assert {i.op for i in new.body} >= {"sin", "tanh"} and "cos" not in {i.op for i in new.body}
    np.testing.assert_allclose(interpret(m1, "f", x), np.sin(x) + np.tanh(x), rtol=1e-6)


def test_a_dead_carry_goes_and_a_live_one_stays():
    def f(x):  # the counter is dead: the body ignores i and the result drops it
        return dq.fori_loop(0, 5, lambda i, v: dq.sin(v), x)

    def g(x):  # here the body reads i: it stays
        return dq.fori_loop(0, 5, lambda i, v: v * i.astype("f32"), x)

    x = RNG.standard_normal(3).astype(np.float32)
    for fun, carries in ((f, 1), (g, 2)):
        m0, fn = _fn(fun, x)
        assert _ops(fn, "scan")[0].attrs["carries"] == 2
        m1, new = _rewritten(fn)
        assert _ops(new, "scan")[0].attrs["carries"] == carries
        np.testing.assert_allclose(
            interpret(m1, fun.__name__, x), interpret(m0, fun.__name__, x), rtol=1e-6
        )


def test_a_scan_of_one_step_is_its_body_inlined():
    args = _rnn_args()
    args = (*args[:4], args[4][:1])  # one step
    m0, fn = _fn(rnn, *args)
    m1, new = _rewritten(fn)
    assert not _ops(new, "scan") and len(_ops(new, "tanh")) == 1
    _same(m0, m1, "rnn", args)
