"""dq.scan, fori_loop, while_loop, cond and switch: traced into control-flow ops, run on the
interpreter and compiled for the cpu, against Python loops (the unrolled program) as oracle."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.errors import DlvmError, ShapeError
from dlvm_eq.ir.parser import parse

RNG = np.random.default_rng(7)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def rnn(w, h0, xs, reverse=False):
    def step(h, x):
        h = dq.tanh(x @ w + h)
        return h, h * 2.0

    return dq.scan(step, h0, xs, reverse=reverse)


def rnn_ref(w, h0, xs, reverse=False):
    h, ys = h0, [None] * len(xs)
    for t in reversed(range(len(xs))) if reverse else range(len(xs)):
        h = np.tanh(xs[t] @ w + h)
        ys[t] = h * 2
    return h, np.stack(ys) if len(xs) else np.zeros((0, *h0.shape), np.float32)


@pytest.mark.parametrize("target", ["interp", "cpu"])
@pytest.mark.parametrize("steps", [0, 1, 7])
@pytest.mark.parametrize("reverse", [False, True])
def test_scan_equals_the_python_loop(target, steps, reverse):
    w, h0, xs = f32(3, 4), f32(4), f32(steps, 3)
    got = dq.jit(lambda w, h, xs: rnn(w, h, xs, reverse), target=target)(w, h0, xs)
    want = rnn_ref(w, h0, xs, reverse)
    for g, r in zip(got, want):
        assert g.shape == r.shape and g.dtype == np.float32
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)


def test_pytree_carries_and_xs_and_no_ys():
    def f(p, xs):
        def step(c, x):
            return {"a": c["a"] + x[0], "b": (c["b"][0] * x[1],)}, None

        return dq.scan(step, {"a": p, "b": (p * 0.0 + 1.0,)}, (xs, xs * 2.0))

    p, xs = f32(3), f32(5, 3)
    for target in ("interp", "cpu"):
        (c, ys) = dq.jit(f, target=target)(p, xs)
        assert ys is None
        np.testing.assert_allclose(c["a"], p + xs.sum(0), rtol=1e-5)
        np.testing.assert_allclose(c["b"][0], np.prod(xs * 2, axis=0), rtol=1e-4)


def test_scan_without_xs_needs_length():
    def f(x):
        return dq.scan(lambda c, _: (c * 0.5, c), x, length=4)

    x = f32(2)
    c, ys = dq.jit(f, target="cpu")(x)
    np.testing.assert_allclose(c, x / 16, rtol=1e-6)
    np.testing.assert_allclose(ys, np.stack([x, x / 2, x / 4, x / 8]), rtol=1e-6)
    with pytest.raises(ShapeError, match="give length="):
        dq.make_ir(lambda x: dq.scan(lambda c, _: (c, c), x))(x)


def test_make_ir_shows_the_scan_and_its_body_and_round_trips():
    m = dq.make_ir(rnn)(f32(3, 4), f32(4), f32(6, 3))
    text = str(m)
    assert "= scan @step carry (%h0: <4 x f32>) over (%xs: <6 x 3 x f32>) with" in text
    assert "func @step: (<4 x f32>, <3 x f32>, <3 x 4 x f32>)" in text
    assert text.count("tanh") == 1  # the body is traced once, not unrolled
    again = parse(text)
    assert str(again) == text
    args = (f32(3, 4), f32(4), f32(6, 3))
    for g, r in zip(dq.interpret(again, "rnn", *args), rnn_ref(*args)):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)


def test_carry_that_changes_type_names_the_line_and_both_types():
    def f(x):
        return dq.scan(lambda c, _: (c.sum(), c), x, length=3)  # the line named

    with pytest.raises(ShapeError) as e:
        dq.make_ir(f)(f32(3))
    msg = str(e.value)
    assert f"test_control_flow_dsl.py:{f.__code__.co_firstlineno + 1}" in msg
    assert "<3 x f32>" in msg and "returns it as f32" in msg


def test_carry_dtype_change_is_an_error():
    with pytest.raises(ShapeError, match=r"enters .* as i32 but .* returns it as f32"):
        dq.make_ir(lambda x: dq.fori_loop(0, 3, lambda i, c: (c[0] * 1.5, c[1]), (0, x)))(f32(2))


def test_branches_that_disagree_name_both_types():
    def f(p, x):
        return dq.cond(p, lambda x: x, lambda x: x.sum(), x)

    with pytest.raises(ShapeError) as e:
        dq.make_ir(f)(np.bool_(True), f32(3))
    msg = str(e.value)
    assert "branches disagree" in msg and "<3 x f32>" in msg and "f32" in msg
    assert f"test_control_flow_dsl.py:{f.__code__.co_firstlineno + 1}" in msg


def test_fori_loop_static_bounds_is_a_scan_and_traced_bounds_a_while():
    def f(x):
        return dq.fori_loop(2, 7, lambda i, x: x * 0.5 + i.astype("f32"), x)

    x = f32(3)
    want = x.copy()
    for i in range(2, 7):
        want = want * 0.5 + i
    assert "= scan @" in str(dq.make_ir(f)(x))
    for target in ("interp", "cpu"):
        np.testing.assert_allclose(dq.jit(f, target=target)(x), want, rtol=1e-5)

    def g(n, x):
        return dq.fori_loop(0, n, lambda i, x: x * 2.0, x)

    assert "= while @" in str(dq.make_ir(g)(np.int32(3), x))
    for target in ("interp", "cpu"):
        np.testing.assert_allclose(dq.jit(g, target=target)(np.int32(3), x), x * 8, rtol=1e-6)


def test_while_loop_cond_and_switch_compiled_equal_the_interpreter():
    def f(x, k):
        def body(c):
            i, v = c
            return i + 1, dq.cond(i < 2, lambda v: v * 2.0, lambda v: v - 1.0, v)

        n, v = dq.while_loop(lambda c: c[0] < 5, body, (0, x))
        return n, dq.switch(k, [lambda v: -v, dq.exp, lambda v: v * x], v)

    x = f32(4)
    v = x.copy()
    for i in range(5):
        v = v * 2 if i < 2 else v - 1
    for k in (-3, 0, 1, 2, 9):
        want = [-v, np.exp(v), v * x][min(max(k, 0), 2)]
        for target in ("interp", "cpu"):
            n, got = dq.jit(f, target=target)(x, np.int32(k))
            assert int(n) == 5
            np.testing.assert_allclose(got, want, rtol=1e-5)


def test_bodies_close_over_outer_values():
    def f(w, x):
        scale = dq.exp(w)  # computed outside, read inside both loops

        def outer(c, xi):
            inner, _ = dq.scan(lambda d, _: (d * scale, None), c + xi, length=2)
            return inner, None

        return dq.scan(outer, x[0], x)[0]

    w, x = f32(3) * 0.1, f32(4, 3)
    # The oracle runs in float64: (c + xi) can cancel, so an element near zero carries float32
    # rounding of its larger neighbours; the tolerance is relative to the largest element.
    c, s = x[0].astype(np.float64), np.exp(w.astype(np.float64))
    for xi in x:
        c = (c + xi) * s * s
    for target in ("interp", "cpu"):
        got = dq.jit(f, target=target)(w, x)
        np.testing.assert_allclose(got, c, rtol=1e-5, atol=1e-6 * np.abs(c).max())


def test_eager_calls_run_the_interpreter():
    x = f32(3)
    c, ys = dq.scan(lambda c, x: (c + x, c), np.zeros(3, np.float32), np.stack([x, x]))
    np.testing.assert_allclose(c, 2 * x, rtol=1e-6)
    np.testing.assert_allclose(ys, np.stack([np.zeros(3), x]), rtol=1e-6)
    assert float(dq.fori_loop(0, 4, lambda i, v: v + 1.0, 0.0)) == 4.0
    np.testing.assert_allclose(dq.cond(False, lambda v: -v, dq.exp, x), np.exp(x), rtol=1e-6)


def test_the_body_is_compiled_once_whatever_the_length():
    reports = []
    for steps in (3, 40):
        args = (f32(3, 4), f32(4), f32(steps, 3))
        report = dq.jit(rnn).report(*args)
        reports.append([label for label, _ in report.parts])
        got = dq.jit(rnn)(*args)
        np.testing.assert_allclose(got[1], rnn_ref(*args)[1], rtol=2e-5, atol=2e-6)
    # one piece before the loop: x @ w for all steps, one product (rules/loops.egg)
    assert reports[0] == reports[1] == ["piece 0", "%1 = scan"]


def test_while_loop_under_grad_is_a_clear_error_unless_max_steps():
    def f(x):
        return dq.sum(dq.while_loop(lambda c: dq.sum(c) < 10.0, lambda c: c * 2.0, x))

    x = np.ones(2, np.float32)
    with pytest.raises(DlvmError, match="max_steps"):
        dq.grad(f)(x)

    def g(x):
        return dq.sum(dq.while_loop(lambda c: dq.sum(c) < 10.0, lambda c: c * 2.0, x, max_steps=10))

    assert float(dq.jit(g, target="cpu")(x)) == pytest.approx(16.0)
    np.testing.assert_allclose(dq.grad(g)(x), [8.0, 8.0], rtol=1e-6)  # doubled three times


def test_sgd_steps_inside_one_jit_call_equal_separate_calls():
    x, y = f32(64, 8), f32(64, 1)
    w0 = np.zeros((8, 1), np.float32)
    g = dq.grad(lambda w, x, y: dq.mean(dq.square(x @ w - y)))
    many = dq.jit(lambda w, x, y: dq.fori_loop(0, 20, lambda i, w: w - 0.1 * g(w, x, y), w))
    one = dq.jit(lambda w, x, y: w - 0.1 * g(w, x, y))
    w = w0
    for _ in range(20):
        w = one(w, x, y)
    np.testing.assert_allclose(many(w0, x, y), w, rtol=1e-5, atol=1e-6)
    assert "= scan @" in str(many.lower(w0, x, y))
