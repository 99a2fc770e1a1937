"""Gradients through scan, cond, fori_loop and while_loop(max_steps=): equal to the unrolled
program's gradients and to float64 central differences, on the interpreter and the cpu; grad
of grad (a Hessian-vector product) through a scan."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.dsl.pytree import tree_leaves, tree_map

RNG = np.random.default_rng(11)
H, D, B = 5, 3, 2


def params():
    return {
        "wz": RNG.standard_normal((D, H)) * 0.5,
        "uz": RNG.standard_normal((H, H)) * 0.5,
        "wr": RNG.standard_normal((D, H)) * 0.5,
        "ur": RNG.standard_normal((H, H)) * 0.5,
        "wh": RNG.standard_normal((D, H)) * 0.5,
        "uh": RNG.standard_normal((H, H)) * 0.5,
        "b": RNG.standard_normal(H) * 0.1,
    }


def gru_cell(p, h, x):
    z = dq.sigmoid(x @ p["wz"] + h @ p["uz"])
    r = dq.sigmoid(x @ p["wr"] + h @ p["ur"] + p["b"])
    c = dq.tanh(x @ p["wh"] + (r * h) @ p["uh"])
    return (1.0 - z) * h + z * c


def gru_scan(p, h0, xs):
    def step(h, x):
        h = gru_cell(p, h, x)
        return h, dq.sum(h * h)

    h, ys = dq.scan(step, h0, xs)
    return dq.sum(ys) + dq.sum(dq.tanh(h))


def gru_unrolled(p, h0, xs):
    h, total = h0, 0.0
    for t in range(xs.shape[0]):
        h = gru_cell(p, h, xs[t])
        total = total + dq.sum(h * h)
    return total + dq.sum(dq.tanh(h))


def directional_fd(f, args, argnum, direction, eps=1e-6):
    """Central difference of f along `direction` of argument `argnum` (a pytree of arrays)."""

    def moved(s):
        a = list(args)
        a[argnum] = tree_map(lambda x, d: x + s * d, args[argnum], direction)
        return float(f(*a))

    return (moved(eps) - moved(-eps)) / (2 * eps)


def dot(a, b) -> float:
    return sum(float(np.sum(x * y)) for x, y in zip(tree_leaves(a), tree_leaves(b)))


@pytest.mark.parametrize("steps", [0, 1, 6])
@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_gru_scan_gradients_equal_the_unrolled_and_finite_differences(steps, target):
    p, h0, xs = params(), RNG.standard_normal((B, H)), RNG.standard_normal((steps, B, D))
    vg = dq.jit(dq.value_and_grad(gru_scan, argnums=(0, 1, 2)), target=target)
    value, grads = vg(p, h0, xs)
    u_value, u_grads = dq.jit(dq.value_and_grad(gru_unrolled, argnums=(0, 1, 2)), target=target)(
        p, h0, xs
    )
    assert float(value) == pytest.approx(float(u_value), rel=1e-12)
    for g, u in zip(tree_leaves(grads), tree_leaves(u_grads)):
        np.testing.assert_allclose(g, u, rtol=1e-9, atol=1e-12)
    for k, arg in enumerate((p, h0, xs)):
        d = tree_map(lambda a: RNG.standard_normal(np.shape(a)), arg)
        fd = directional_fd(lambda *a: dq.jit(gru_scan, target="interp")(*a), (p, h0, xs), k, d)
        assert dot(grads[k], d) == pytest.approx(fd, rel=1e-6, abs=1e-8)


def test_reverse_scan_with_a_with_operand_and_a_stacked_output():
    def f(w, xs):
        c, ys = dq.scan(lambda c, x: (c * w + x, dq.sin(c) * w), w, xs, reverse=True)
        return dq.sum(ys * ys) + dq.sum(c)

    w, xs = RNG.standard_normal(3), RNG.standard_normal((5, 3))
    gw, gx = dq.grad(f, argnums=(0, 1))(w, xs)
    for k, (arg, g) in enumerate(((w, gw), (xs, gx))):
        d = RNG.standard_normal(arg.shape)
        fd = directional_fd(lambda *a: dq.jit(f, target="interp")(*a), (w, xs), k, d)
        assert float(np.sum(g * d)) == pytest.approx(fd, rel=1e-6)


def test_cond_gradient_is_the_taken_branch():
    def f(x, p):
        return dq.sum(dq.cond(p, lambda v: dq.sin(v) * x, lambda v: v * v, x))

    x = RNG.standard_normal(4)
    np.testing.assert_allclose(dq.grad(f)(x, np.bool_(True)), np.cos(x) * x + np.sin(x))
    np.testing.assert_allclose(dq.grad(f)(x, np.bool_(False)), 2 * x)


def test_cond_inside_scan_and_switch_gradients():
    def f(w, xs):
        def step(c, x):
            c = dq.cond(dq.sum(x) > 0.0, lambda c: c * w, lambda c: dq.tanh(c + w), c)
            return c, dq.switch((dq.sum(x) > 0.5).astype("i32"), [dq.sin, dq.cos], c)

        c, ys = dq.scan(step, xs[0], xs)
        return dq.sum(c) + dq.sum(ys)

    w, xs = RNG.standard_normal(3), RNG.standard_normal((6, 3))
    for target in ("interp", "cpu"):
        gw, gx = dq.jit(dq.grad(f, argnums=(0, 1)), target=target)(w, xs)
        for k, (arg, g) in enumerate(((w, gw), (xs, gx))):
            d = RNG.standard_normal(arg.shape)
            fd = directional_fd(lambda *a: dq.jit(f, target="interp")(*a), (w, xs), k, d)
            assert float(np.sum(g * d)) == pytest.approx(fd, rel=1e-6)


def test_fori_loop_differentiates_as_a_scan():
    def f(x):
        return dq.sum(dq.fori_loop(0, 4, lambda i, v: dq.sin(v) * 1.5, x))

    x = RNG.standard_normal(3)
    g = dq.grad(f)(x)
    v, want = x.copy(), np.ones(3)
    for _ in range(4):
        want, v = want * np.cos(v) * 1.5, np.sin(v) * 1.5
    np.testing.assert_allclose(g, want, rtol=1e-12)


def test_grad_of_grad_through_a_scan():
    def f(x):
        c, ys = dq.scan(lambda c, w: (dq.sin(c * w), c * c), x, np.linspace(0.5, 1.5, 4))
        return dq.sum(c) + dq.sum(ys)

    x, v = RNG.standard_normal(3) * 0.5, RNG.standard_normal(3)
    hvp = dq.grad(lambda x: dq.sum(dq.grad(f)(x) * v))(x)
    eps = 1e-5
    fd = (dq.grad(f)(x + eps * v) - dq.grad(f)(x - eps * v)) / (2 * eps)
    np.testing.assert_allclose(hvp, fd, rtol=1e-6, atol=1e-9)


def test_declared_adjoint_of_a_dl_function_with_a_scan():
    from pathlib import Path

    from dlvm_eq.ir import verify
    from dlvm_eq.ir.parser import parse
    from dlvm_eq.pipeline import resolve_adjoints

    m = dq.load(Path(__file__).parent / "data" / "control_flow" / "declared.dl")
    h, xs, w = (RNG.standard_normal(s).astype(np.float32) for s in ((4,), (8, 3), (3, 4)))
    want = dq.interpret(m, "loss_grad", h, xs, w)
    got = dq.compile(m, "loss_grad")(h, xs, w)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)
    resolved = resolve_adjoints(m)
    verify(resolved)  # the adjoint's loop bodies are functions of the module
    again = parse(str(resolved))
    for g, r in zip(dq.interpret(again, "loss_grad", h, xs, w), want):
        np.testing.assert_allclose(g, r, rtol=1e-6)
    d = RNG.standard_normal(w.shape)
    fd = directional_fd(
        lambda w_: dq.interpret(m, "loss", h, xs, w_, float64=True), (w.astype(np.float64),), 0, d
    )
    assert float(np.sum(want[2] * d)) == pytest.approx(fd, rel=1e-3)
    # dq.optimize holds the loop and its body in one e-graph (tests/test_optimize_loops.py)
    opt = dq.optimize(m, "loss_grad")
    verify(opt.module)
    for g, r in zip(dq.interpret(opt.module, "loss_grad", h, xs, w), want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_vjp_through_a_scan_with_pytree_outputs():
    def f(w, xs):
        c, ys = dq.scan(lambda c, x: (c * w + x, {"s": dq.sin(c)}), w, xs)
        return c, ys

    w, xs = RNG.standard_normal(3), RNG.standard_normal((4, 3))
    (c, ys), f_vjp = dq.vjp(f, w, xs)
    ct = (RNG.standard_normal(3), {"s": RNG.standard_normal((4, 3))})
    gw, gx = f_vjp(ct)

    def scalar(w, xs):
        c, ys = f(w, xs)
        return dq.sum(c * ct[0]) + dq.sum(ys["s"] * ct[1]["s"])

    want = dq.grad(scalar, argnums=(0, 1))(w, xs)
    np.testing.assert_allclose(gw, want[0], rtol=1e-12)
    np.testing.assert_allclose(gx, want[1], rtol=1e-12)


@pytest.mark.parametrize("steps,reverse", [(10, False), (7, True), (16, False)])
def test_sqrt_checkpointing_gives_the_same_value_and_gradient(steps, reverse):
    w, h0 = RNG.standard_normal((3, 3)) * 0.3, RNG.standard_normal((2, 3))
    xs = RNG.standard_normal((steps, 2, 3))

    def loss(w, h0, xs, ck):
        def step(h, x):
            return dq.tanh(h @ w + x), {"h": h * 2.0}

        h, ys = dq.scan(step, h0, xs, reverse=reverse, checkpoint=ck)
        return dq.sum(ys["h"] * dq.sin(ys["h"])) + dq.sum(h)

    ir = str(dq.make_ir(lambda *a: loss(*a, "sqrt"))(w, h0, xs))
    assert ir.count("= scan @") == (2 if steps == 16 else 3)  # segments (+ the steps left)
    want = dq.jit(dq.value_and_grad(lambda *a: loss(*a, None), argnums=(0, 1, 2)))(w, h0, xs)
    got = dq.jit(dq.value_and_grad(lambda *a: loss(*a, "sqrt"), argnums=(0, 1, 2)))(w, h0, xs)
    assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-12)
    for g, r in zip(got[1], want[1]):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)
