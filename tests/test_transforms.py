"""vmap, jvp/linearize/jacfwd/jacrev/hessian, stop_gradient, has_aux, custom_vjp and
check_grads, against oracles that do not share their code: Python loops over examples, float64
central differences, and numpy."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.ir.batching import BatchError
from dlvm_eq.verify.numeric import GradientCheckError

RNG = np.random.default_rng(31)


def interp(fn):
    """fn traced under a jit on the reference interpreter: the transforms run in trace mode."""
    return dq.jit(fn, target="interp")


def mlp_loss(w1, w2, x, y):
    h = dq.tanh(x @ w1)
    return dq.sum((h @ w2 - y) ** 2)


def mlp_args(batch=None):
    lead = () if batch is None else (batch,)
    return (
        RNG.standard_normal((3, 5)),
        RNG.standard_normal((5, 2)),
        RNG.standard_normal(lead + (4, 3)),
        RNG.standard_normal(lead + (4, 2)),
    )


def central(f, x, v, eps=1e-6):
    return (np.asarray(f(x + eps * v)) - np.asarray(f(x - eps * v))) / (2 * eps)


# ---------------------------------------------------------------- vmap


def test_vmap_matches_a_loop_over_examples():
    w1, w2, xs, ys = mlp_args(batch=6)
    got = dq.vmap(mlp_loss, in_axes=(None, None, 0, 0))(w1, w2, xs, ys)
    want = [mlp_loss(w1, w2, x, y) for x, y in zip(xs, ys)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_vmap_of_grad_gives_per_example_gradients():
    w1, w2, xs, ys = mlp_args(batch=5)
    per_example = dq.vmap(dq.grad(mlp_loss, argnums=(0, 1)), in_axes=(None, None, 0, 0))
    g1, g2 = per_example(w1, w2, xs, ys)
    assert g1.shape == (5, 3, 5) and g2.shape == (5, 5, 2)
    for b in range(5):
        w1b, w2b = dq.grad(mlp_loss, argnums=(0, 1))(w1, w2, xs[b], ys[b])
        np.testing.assert_allclose(g1[b], w1b, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(g2[b], w2b, rtol=1e-10, atol=1e-12)


def test_vmap_is_one_program_not_a_loop():
    """The batched program's size does not grow with the batch, and its matmuls of a
    batched right operand are batched products."""
    f = dq.vmap(lambda w, x: dq.sum(dq.tanh(x @ w)), in_axes=(0, 0))
    sizes = []
    for batch in (2, 7):
        ir = dq.make_ir(f)(RNG.standard_normal((batch, 3, 4)), RNG.standard_normal((batch, 2, 3)))
        ops = [i.op for i in next(iter(ir.functions.values())).body]
        assert "batchMatmul" in ops and "dot" not in ops
        sizes.append(len(ops))
    assert sizes[0] == sizes[1]


@pytest.mark.parametrize("a_shape", [(3,), (2, 3)])
@pytest.mark.parametrize("b_shape", [(3,), (3, 4)])
@pytest.mark.parametrize("axes", [(0, None), (None, 0), (0, 0)])
def test_vmap_of_every_product_shape(a_shape, b_shape, axes):
    """dot's batching rule, each case: one product when one side is batched, a batched
    product (or an outer product's multiply) when both are."""
    a = RNG.standard_normal(((4,) if axes[0] == 0 else ()) + a_shape)
    b = RNG.standard_normal(((4,) if axes[1] == 0 else ()) + b_shape)
    got = interp(dq.vmap(lambda a, b: a @ b, in_axes=axes))(a, b)
    want = [(a[i] if axes[0] == 0 else a) @ (b[i] if axes[1] == 0 else b) for i in range(4)]
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-12)


def test_vmap_of_outer_products():
    a, b = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 5))
    outer = dq.vmap(lambda a, b: dq.reshape(a, (-1, 1)) @ dq.reshape(b, (1, -1)))
    np.testing.assert_allclose(interp(outer)(a, b), np.einsum("bi,bj->bij", a, b), rtol=1e-12)
    ops = [i.op for i in next(iter(dq.make_ir(outer)(a, b).functions.values())).body]
    assert "batchMatmul" not in ops and "multiply" in ops


def test_vmap_in_axes_and_out_axes():
    x = RNG.standard_normal((3, 4, 5))
    got = dq.vmap(lambda a: dq.exp(a) * 2.0, in_axes=1, out_axes=2)(x)
    np.testing.assert_allclose(got, np.moveaxis(np.exp(x) * 2, 1, 2), rtol=1e-12)
    a, v = RNG.standard_normal((4, 5)), RNG.standard_normal(4)
    f = lambda r, b: (dq.sum(r * b), b * 3.0)
    sums, tripled = dq.vmap(f, in_axes=(-1, None), out_axes=(0, None))(a, v)
    np.testing.assert_allclose(sums, a.T @ v, rtol=1e-12)
    np.testing.assert_allclose(tripled, v * 3.0, rtol=1e-12)
    with pytest.raises(BatchError, match="out_axes None"):
        dq.vmap(f, in_axes=(None, 0), out_axes=(0, None))(a, v)


def test_nested_vmap_and_vmap_under_jit():
    a, b = RNG.standard_normal((2, 3, 4)), RNG.standard_normal(4)
    f = lambda r, v: r * v + dq.max(r)
    inner = dq.vmap(f, in_axes=(0, None))
    got = dq.jit(dq.vmap(inner, in_axes=(0, None)))(a, b)
    np.testing.assert_allclose(got, a * b + a.max(axis=-1, keepdims=True), rtol=1e-12)
    ws, xs = RNG.standard_normal((2, 3, 4, 5)), RNG.standard_normal((2, 3, 6, 4))
    got = dq.vmap(dq.vmap(lambda w, x: x @ w))(ws, xs)  # a batched product of rank 4
    np.testing.assert_allclose(got, xs @ ws, rtol=1e-12)
    got = dq.vmap(dq.vmap(dq.vmap(lambda w, x: x @ w)))(ws[None], xs[None])  # rank 5, folded
    np.testing.assert_allclose(got, (xs @ ws)[None], rtol=1e-12)


def test_grad_of_vmap_is_the_sum_of_per_example_gradients():
    w1, w2, xs, ys = mlp_args(batch=4)
    total = lambda w1: dq.sum(dq.vmap(mlp_loss, in_axes=(None, None, 0, 0))(w1, w2, xs, ys))
    got = dq.grad(total)(w1)
    want = sum(dq.grad(mlp_loss)(w1, w2, x, y) for x, y in zip(xs, ys))
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_vmap_over_layout_reductions_and_integer_labels():
    def f(x, label):
        z = dq.concatenate([x, x[:, ::2][:, 1:] * 2.0], axis=1)
        z = dq.transpose(z)[1:, :]
        logits = dq.sum(z, axis=0) + dq.cumsum(z, axis=1)[0]
        return dq.take(logits, label) - dq.max(logits)

    xs = RNG.standard_normal((5, 3, 4))
    labels = RNG.integers(0, 3, size=(5, 2)).astype(np.int32)
    got = interp(dq.vmap(f))(xs, labels)
    want = np.stack([interp(f)(x, lab) for x, lab in zip(xs, labels)])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_vmap_of_convolution_folds_into_the_image_batch():
    x = RNG.standard_normal((3, 2, 1, 6, 6))
    w = RNG.standard_normal((4, 1, 3, 3))
    f = lambda x: dq.max_pool2d(dq.conv2d(x, w, padding=1), 2)
    got = interp(dq.vmap(f))(x)
    np.testing.assert_allclose(got, np.stack([interp(f)(xb) for xb in x]), rtol=1e-12)


@pytest.mark.parametrize("groups", [1, 2])
def test_vmap_of_convolutions_with_per_example_weights(groups):
    """Batched weights fold into the channels as more groups (an ensemble), and per-example
    weight gradients (DP-SGD on a CNN) are one grouped conv2dBackwardWeight."""
    x = RNG.standard_normal((3, 2, 2, 6, 6))
    ws = RNG.standard_normal((3, 4, 2 // groups, 3, 3))
    f = lambda x, w: dq.conv2d(x, w, padding=1, groups=groups)
    for axes in ((0, 0), (None, 0)):
        xs = x if axes[0] == 0 else x[0]
        got = interp(dq.vmap(f, in_axes=axes))(xs, ws)
        want = [interp(f)(x[b] if axes[0] == 0 else xs, ws[b]) for b in range(3)]
        np.testing.assert_allclose(got, np.stack(want), rtol=1e-12, atol=1e-12)

    def loss(w, x):
        return dq.sum(dq.tanh(dq.conv2d(x, w, padding=1, groups=groups)) ** 2)

    per_example = interp(dq.vmap(dq.grad(loss), in_axes=(None, 0)))(ws[0], x)
    for b in range(3):
        np.testing.assert_allclose(per_example[b], dq.grad(loss)(ws[0], x[b]), rtol=1e-10)
    inputs = interp(dq.vmap(dq.grad(loss, argnums=1), in_axes=(0, None)))(ws, x[0])
    for b in range(3):
        np.testing.assert_allclose(inputs[b], dq.grad(loss, argnums=1)(ws[b], x[0]), rtol=1e-10)


def test_vmap_errors_name_the_problem():
    with pytest.raises(BatchError, match="different sizes"):
        dq.vmap(lambda a, b: a + b)(np.ones((2, 3)), np.ones((3, 3)))
    # loops batch (tests/test_control_flow_vmap.py): a fori_loop is no error
    x = np.arange(6.0).reshape(2, 3) / 6
    looped = dq.vmap(lambda x: dq.fori_loop(0, 3, lambda i, h: dq.tanh(h), x))(x)
    np.testing.assert_allclose(looped, np.tanh(np.tanh(np.tanh(x))), rtol=1e-12)
    with pytest.raises(BatchError, match="batches no argument"):
        dq.vmap(lambda a: a, in_axes=None)(np.ones(2))


# ---------------------------------------------------------------- forward mode and Jacobians

W = RNG.standard_normal((4, 3))


def vector_fn(x):
    return dq.tanh(W @ x) * dq.sum(x**2)


def vector_np(x):
    return np.tanh(W @ x) * np.sum(x**2)


def test_jvp_against_central_differences():
    x, t = RNG.standard_normal(3), RNG.standard_normal(3)
    y, ty = dq.jvp(vector_fn, (x,), (t,))
    np.testing.assert_allclose(y, vector_np(x), rtol=1e-12)
    np.testing.assert_allclose(ty, central(vector_np, x, t), rtol=1e-7, atol=1e-9)


def test_jvp_of_several_arguments_and_pytrees():
    p = {"w": RNG.standard_normal((3, 2)), "b": RNG.standard_normal(2)}
    x = RNG.standard_normal((5, 3))
    tp = {"w": RNG.standard_normal((3, 2)), "b": RNG.standard_normal(2)}
    f = lambda p, x: dq.sigmoid(x @ p["w"] + p["b"])
    fn = lambda p: 1 / (1 + np.exp(-(x @ p["w"] + p["b"])))
    _, ty = dq.jvp(f, (p, x), (tp, np.zeros_like(x)))
    e = 1e-6
    up = fn({k: p[k] + e * tp[k] for k in p})
    down = fn({k: p[k] - e * tp[k] for k in p})
    np.testing.assert_allclose(ty, (up - down) / (2 * e), rtol=1e-7, atol=1e-9)


def test_linearize():
    x = RNG.standard_normal(3)
    y, f_jvp = dq.linearize(vector_fn, x)
    np.testing.assert_allclose(y, vector_np(x), rtol=1e-12)
    for _ in range(2):
        t = RNG.standard_normal(3)
        np.testing.assert_allclose(f_jvp(t), central(vector_np, x, t), rtol=1e-7, atol=1e-9)


def fd_jacobian(f, x, eps=1e-6):
    cols = [central(f, x, e.reshape(x.shape), eps) for e in np.eye(x.size)]
    return np.stack(cols, axis=-1).reshape(np.shape(f(x)) + x.shape)


def test_jacrev_and_jacfwd_against_central_differences():
    x = RNG.standard_normal(3)
    want = fd_jacobian(vector_np, x)
    np.testing.assert_allclose(dq.jacrev(vector_fn)(x), want, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(dq.jacfwd(vector_fn)(x), want, rtol=1e-7, atol=1e-9)
    m = RNG.standard_normal((2, 3))
    f = lambda m: dq.exp(m) @ W.T  # (2, 4) of a (2, 3) argument: (2, 4, 2, 3)
    want = fd_jacobian(lambda m: np.exp(m) @ W.T, m)
    np.testing.assert_allclose(dq.jacfwd(f)(m), want, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(dq.jacrev(f)(m), want, rtol=1e-7, atol=1e-9)


def test_hessian_against_differences_of_the_gradient():
    x = RNG.standard_normal(3)
    loss = lambda x: dq.sum(dq.tanh(W @ x) ** 2) + dq.sum(x**3)
    grad_np = lambda x: np.asarray(dq.grad(loss)(x))
    h = dq.hessian(loss)(x)
    np.testing.assert_allclose(h, fd_jacobian(grad_np, x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(h, h.T, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- stop_gradient and has_aux


def test_stop_gradient_first_and_second_order():
    x = RNG.standard_normal(4)
    f = lambda x: dq.sum(x * dq.stop_gradient(x**2))
    np.testing.assert_allclose(dq.grad(f)(x), x**2, rtol=1e-12)  # not 3 x^2
    g2 = dq.grad(lambda x: dq.grad(f)(x)[0])(x)
    np.testing.assert_array_equal(g2, np.zeros(4))  # not 2 x[0] e_0
    # compiled to kernels: the op lowers as the identity
    np.testing.assert_allclose(dq.jit(f)(x), np.sum(x**3), rtol=1e-12)
    np.testing.assert_allclose(dq.stop_gradient(x), x)


def test_has_aux():
    x = RNG.standard_normal(3)

    def f(x):
        return dq.sum(dq.sin(x)), {"cos": dq.cos(x), "n": dq.sum(x * 0.0 + 1.0)}

    g, aux = dq.grad(f, has_aux=True)(x)
    np.testing.assert_allclose(g, np.cos(x), rtol=1e-12)
    np.testing.assert_allclose(aux["cos"], np.cos(x), rtol=1e-12)
    assert float(aux["n"]) == 3.0
    (value, aux), g = dq.value_and_grad(f, has_aux=True)(x)
    np.testing.assert_allclose(value, np.sum(np.sin(x)), rtol=1e-12)
    with pytest.raises(dq.DlvmError, match="pair"):
        dq.grad(lambda x: dq.sum(x), has_aux=True)(x)


# ---------------------------------------------------------------- custom_vjp and check_grads


def softplus_with_custom_gradient(scale):
    @dq.custom_vjp
    def f(x, y):
        return dq.log1p(dq.exp(x)) * y

    def fwd(x, y):
        return f(x, y), (dq.sigmoid(x), dq.log1p(dq.exp(x)), y)

    def bwd(res, g):
        s, sp, y = res
        return (g * s * y * scale, g * sp)

    f.defvjp(fwd, bwd)
    return f


def test_custom_vjp_uses_the_users_adjoint():
    x, y = RNG.standard_normal(3), RNG.standard_normal(3)
    f = softplus_with_custom_gradient(scale=3.0)  # deliberately 3x the true derivative in x
    np.testing.assert_allclose(f(x, y), np.log1p(np.exp(x)) * y, rtol=1e-12)
    np.testing.assert_allclose(dq.jit(f)(x, y), np.log1p(np.exp(x)) * y, rtol=1e-12)
    gx, gy = dq.grad(lambda x, y: dq.sum(f(x, y)), argnums=(0, 1))(x, y)
    sig = 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(gx, 3.0 * sig * y, rtol=1e-12)
    np.testing.assert_allclose(gy, np.log1p(np.exp(x)), rtol=1e-12)


def test_check_grads_passes_a_right_adjoint_and_catches_a_wrong_one():
    x, y = RNG.standard_normal(3), RNG.standard_normal(3)
    right = softplus_with_custom_gradient(scale=1.0)
    assert dq.check_grads(right, (x, y), order=1, modes=("rev",))
    scalar = lambda x: dq.sum(dq.tanh(W @ x))
    assert [c.order for c in dq.check_grads(scalar, (x,), order=2)] == [1, 2]
    both = dq.check_grads(scalar, (x,), order=2, modes=("fwd", "rev"))
    assert [c.order for c in both] == [1, 2, 1, 2]
    wrong = softplus_with_custom_gradient(scale=3.0)
    with pytest.raises(GradientCheckError):
        dq.check_grads(wrong, (x, y), order=1, modes=("rev",))
    with pytest.raises(GradientCheckError):
        dq.check_grads(wrong, (x, y), order=1, modes=("fwd",))


def test_per_example_gradients_with_integer_labels():
    """DP-SGD's pattern: per-example gradients of a cross-entropy that indexes by label (a
    batched take, and in the adjoint a batched scatterAdd)."""

    def loss(w, x, label):
        logits = x @ w
        return dq.logsumexp(logits) - dq.sum(dq.take(logits, label))

    w = RNG.standard_normal((4, 6))
    xs = RNG.standard_normal((5, 4))
    labels = RNG.integers(0, 6, size=(5, 1)).astype(np.int32)
    got = interp(dq.vmap(dq.grad(loss), in_axes=(None, 0, 0)))(w, xs, labels)
    for b in range(5):
        np.testing.assert_allclose(got[b], dq.grad(loss)(w, xs[b], labels[b]), rtol=1e-10)
    table = RNG.standard_normal((6, 3))
    rows = interp(dq.vmap(lambda ids: dq.take(table, ids)))(labels)  # only the indices batched
    np.testing.assert_array_equal(rows, table[labels])


# ---------------------------------------------------------------- random programs

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

UNARY = [dq.tanh, dq.sin, dq.sigmoid, dq.softplus, lambda v: v * v, dq.exp]
BINARY = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b * 0.5]


def random_program(ops):
    """A scalar function of (w (3,), x (4, 3)): random unary and binary steps, a product with
    w, a reduction."""

    def f(w, x):
        h = x @ w
        for kind, i in ops:
            if kind == "u":
                h = UNARY[i % len(UNARY)](h) * 0.5
            elif kind == "b":
                h = BINARY[i % len(BINARY)](h, dq.sum(x, axis=1))
            else:
                h = h + dq.max(x * w, axis=1) * 0.1
        return dq.sum(h)

    return f


programs = st.lists(st.tuples(st.sampled_from("ubm"), st.integers(0, 5)), min_size=1, max_size=4)


@hypothesis.settings(max_examples=6, deadline=None, derandomize=True)
@hypothesis.given(programs)
def test_random_programs_compose_vmap_grad_and_jvp(ops):
    f = random_program(ops)
    rng = np.random.default_rng(len(ops))
    w = rng.standard_normal(3) * 0.5
    xs = rng.standard_normal((3, 4, 3)) * 0.5
    v = rng.standard_normal(3)

    def composed(w, xs):
        grads = dq.vmap(dq.grad(f), in_axes=(None, 0))(w, xs)
        tangents = dq.vmap(lambda x: dq.jvp(lambda w: f(w, x), (w,), (v,))[1])(xs)
        return grads, tangents

    grads, tangents = interp(composed)(w, xs)
    for b in range(3):
        fb = lambda w: np.asarray(interp(f)(w, xs[b]))
        np.testing.assert_allclose(grads[b], dq.grad(f)(w, xs[b]), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(tangents[b], central(fb, w, v), rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(grads[b] @ v, tangents[b], rtol=1e-9, atol=1e-12)


def test_a_region_body_is_batched():
    """What a region op's batching rule (control flow) does with its body: a batched copy of
    the body Function, every output batched."""
    from dlvm_eq.ir import F64, FunctionBuilder, tensor
    from dlvm_eq.ir.batching import Batcher
    from dlvm_eq.ir.interp import run_function

    b = FunctionBuilder("body", [tensor(3, F64), tensor(3, F64)], ["carry", "w"])
    carry, w = b.params
    body = b.finish([b.emit("tanh", [b.emit("multiply", [carry, w])]), w])
    batched = Batcher(FunctionBuilder("outer", []), 4).batch_body(body, [True, False])
    assert [p.type.shape for p in batched.params] == [(4, 3), (3,)]
    assert [t.shape for t in batched.result_type.elements] == [(4, 3), (4, 3)]
    cs, wv = RNG.standard_normal((4, 3)), RNG.standard_normal(3)
    h, ws = run_function(None, batched, [cs, wv])
    np.testing.assert_allclose(h, np.tanh(cs * wv))
    np.testing.assert_allclose(ws, np.broadcast_to(wv, (4, 3)))
