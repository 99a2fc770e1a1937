"""DSL functions composed of existing ops (einsum, stack, zeros/ones/full/arange, one_hot, gelu,
layer_norm, var/std, clip) against float64 numpy: eagerly, in the reference interpreter
(jit target "interp") and compiled (target "cpu"); gradients against central differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.errors import DlvmError, ShapeError
from dlvm_eq.pipeline import check_grads

RNG = np.random.default_rng(3)
TARGETS = ["interp", "cpu"]


def close_everywhere(f, reference, *args, targets=TARGETS, rtol=1e-10, atol=1e-12):
    """f eagerly and jitted on each target equals `reference` (float64 numpy)."""
    expected = reference(*args)
    np.testing.assert_allclose(f(*args), expected, rtol=rtol, atol=atol)
    for target in targets:
        got = dq.jit(f, target=target)(*args)
        assert np.shape(got) == np.shape(expected)
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def gradient_checks(f, *args):
    """dq.grad of <f(args), w> for a random w against central differences."""
    w = RNG.standard_normal(np.shape(f(*args)))
    check_grads(lambda *xs: dq.sum(dq.multiply(f(*xs), w)), args, rtol=1e-6)


# ------------------------------------------------------------------ einsum

SPECS = {  # spec -> operand shapes
    "ij,jk->ik": [(3, 4), (4, 5)],
    "bij,bjk->bik": [(2, 3, 4), (2, 4, 5)],
    "ij->ji": [(3, 4)],
    "ii->i": [(4, 4)],
    "ij->i": [(3, 4)],
    "ij->": [(3, 4)],
    "i,j->ij": [(3,), (4,)],
    "ij,jk": [(2, 3), (3, 2)],  # implicit output: "ik"
    "bij,bkj->bki": [(2, 3, 4), (2, 5, 4)],  # transposed operands and output
    "ij,kj,k->i": [(3, 4), (5, 4), (5,)],  # three operands, left to right
    "ij,ij->i": [(3, 4), (3, 4)],  # a batch index beside a contracted one
    "iij->j": [(3, 3, 2)],
    # ellipsis: leading axes, right-aligned and broadcast across operands (numpy's rules)
    "...ij,...jk->...ik": [(2, 3, 4, 5), (3, 5, 6)],
    "...ij,jk": [(2, 3, 4), (4, 5)],  # implicit output: the ... axes first, then "ik"
    "b...->...b": [(2, 3, 4)],
    "...ii->...i": [(2, 3, 3)],
    "...ij,...ij->...": [(2, 3, 4), (1, 3, 4)],  # a size-1 axis broadcast
    "...ij,jk->ik": [(3, 4), (4, 5)],  # ... of no axes
}


@pytest.mark.parametrize("spec", list(SPECS))
def test_einsum_matches_numpy(spec):
    xs = [RNG.standard_normal(s) for s in SPECS[spec]]
    close_everywhere(lambda *a: dq.einsum(spec, *a), lambda *a: np.einsum(spec, *a), *xs)


@pytest.mark.parametrize(
    "spec",
    ["ij,jk->ik", "bij,bjk->bik", "ii->i", "i,j->ij", "ij,kj,k->i", "...ij,...jk->...ik"]
    + ["...ij,...ij->..."],
)
def test_einsum_gradients(spec):
    gradient_checks(lambda *a: dq.einsum(spec, *a), *[RNG.standard_normal(s) for s in SPECS[spec]])


@settings(max_examples=25)
@given(
    b=st.integers(1, 3),
    i=st.integers(1, 4),
    j=st.integers(1, 4),
    k=st.integers(1, 4),
    spec=st.sampled_from(["bij,bjk->bik", "bij,jk->bik", "bij,bik->jk", "bij->jb", "bji,bi->bj"]),
)
def test_einsum_drawn_sizes_in_the_interpreter(b, i, j, k, spec):
    sizes = {"b": b, "i": i, "j": j, "k": k}
    xs = [
        RNG.standard_normal(tuple(sizes[c] for c in term))
        for term in spec.split("->")[0].split(",")
    ]
    close_everywhere(
        lambda *a: dq.einsum(spec, *a), lambda *a: np.einsum(spec, *a), *xs, targets=["interp"]
    )


def test_einsum_float32_on_cpu():
    a, b = (RNG.standard_normal(s).astype(np.float32) for s in [(2, 3, 4), (2, 4, 5)])
    got = dq.jit(lambda x, y: dq.einsum("bij,bjk->bik", x, y))(a, b)
    assert got.dtype == np.float32
    np.testing.assert_allclose(
        got, np.einsum("bij,bjk->bik", a.astype(np.float64), b), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize(
    "spec, shapes, message",
    [
        ("...ij,...jk->...ik", [(2, 3, 4), (3, 4, 5)], "do not broadcast"),
        ("i.j->ij", [(3, 4)], "letters"),
        ("i...j.->ij", [(3, 4)], "a '.' outside '...'"),
        ("b...->b", [(2, 3)], "the output needs '...'"),  # as numpy
        ("ij,jk->ii", [(3, 4), (4, 5)], "repeated in the output"),
        ("ij->k", [(3, 4)], "output index 'k' is in no operand"),
        ("ij,jk->ik", [(3, 4)], "names 2 operand"),
        ("ij,jk->ik", [(3, 4), (5, 6)], "index 'j' has sizes 4 and 5"),
        ("ijk->i", [(3, 4)], "has 2 axes"),
        ("i1->i", [(3, 4)], "letters"),
    ],
)
def test_einsum_errors(spec, shapes, message):
    with pytest.raises(ShapeError, match=message):
        dq.einsum(spec, *[np.zeros(s) for s in shapes])


# ------------------------------------------------------------------ stack, constants


@settings(max_examples=30)
@given(shape=st.lists(st.integers(1, 3), max_size=3), n=st.integers(1, 3), data=st.data())
def test_stack_matches_numpy(shape, n, data):
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    xs = [RNG.standard_normal(shape) for _ in range(n)]
    close_everywhere(
        lambda *a: dq.stack(a, axis=axis),
        lambda *a: np.stack(a, axis=axis),
        *xs,
        targets=["interp"],
    )


def test_stack_on_cpu_and_its_gradient():
    xs = [RNG.standard_normal((2, 3)) for _ in range(3)]
    close_everywhere(lambda *a: dq.stack(a, axis=1), lambda *a: np.stack(a, axis=1), *xs)
    gradient_checks(lambda *a: dq.stack(a, axis=-1), *xs)
    with pytest.raises(ShapeError, match=r"one shape, got \(2, 3\) and \(3,\)"):
        dq.stack([xs[0], np.zeros(3)])
    with pytest.raises(ShapeError, match="axis 3 is out of range"):
        dq.stack(xs, axis=3)


def test_constants_eagerly():
    z = dq.zeros((2, 3))
    assert z.dtype == np.float32 and z.shape == (2, 3) and not z.any()
    assert dq.ones(4, "f64").dtype == np.float64 and dq.ones(4, "f64").sum() == 4
    np.testing.assert_array_equal(dq.full((2,), 7), [7, 7])
    assert dq.full((2,), 7).dtype == np.int32 and dq.full((2,), 0.5).dtype == np.float32
    np.testing.assert_array_equal(dq.arange(1, 7, 2), [1, 3, 5])
    assert dq.arange(5).dtype == np.int32 and dq.arange(0.0, 1.0, 0.25).dtype == np.float32
    like = dq.zeros_like(np.ones((2, 2), np.float64))
    assert like.dtype == np.float64 and not like.any()
    assert dq.ones_like(np.ones(3, np.int32), dtype="f32").dtype == np.float32
    with pytest.raises(ShapeError, match="must be non-negative ints"):
        dq.zeros((2, -1))
    with pytest.raises(ShapeError, match="step must not be zero"):
        dq.arange(0, 3, 0)


@pytest.mark.parametrize("target", TARGETS)
def test_constants_inside_jit(target):
    def f(x):
        filled = dq.full((2, 3), dq.sum(x))  # a traced fill value broadcasts
        return dq.zeros((2, 3)) + dq.ones_like(filled) * 2.0 + dq.arange(3) * x[0] + filled

    x = RNG.standard_normal(3).astype(np.float32)
    expected = 2.0 + np.arange(3) * x[0] + x.sum()
    # f32 sums of terms up to `size` cancel (a seed gave -0.00646 from terms of 0.17 and 2.0):
    # their rounding bounds the error, not the result's own size
    size = 2.0 + 2 * abs(float(x[0])) + float(np.abs(x).sum())
    np.testing.assert_allclose(
        dq.jit(f, target=target)(x),
        np.broadcast_to(expected, (2, 3)),
        rtol=1e-6,
        atol=4 * np.finfo(np.float32).eps * size,
    )
    ir = str(dq.make_ir(f)(x))
    assert "literal 0.0: <2 x 3 x f32>" in ir and "literal <0, 1, 2>: <3 x i32>" in ir


# ------------------------------------------------------------------ layers


def test_one_hot_matches_numpy():
    ids = np.array([[0, 3], [2, 7]], np.int32)  # 7 is out of range: an all-zero row
    expected = np.concatenate([np.eye(4), np.zeros((1, 4))])[np.minimum(ids, 4)]
    close_everywhere(lambda i: dq.one_hot(i, 4), lambda i: expected, ids, rtol=0, atol=0)
    assert dq.one_hot(ids, 4).dtype == np.float32
    assert dq.one_hot(ids, 4, dtype="f64").dtype == np.float64
    with pytest.raises(ShapeError, match="ids must be integers"):
        dq.one_hot(np.zeros(2), 4)
    with pytest.raises(ShapeError, match="positive int"):
        dq.one_hot(ids, 0)


def gelu_tanh_np(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def test_gelu_tanh_form():
    x = RNG.standard_normal((3, 5)) * 3
    close_everywhere(lambda a: dq.gelu(a, approximate=True), gelu_tanh_np, x)
    gradient_checks(lambda a: dq.gelu(a, approximate=True), x)
    # the tanh form is within 1e-3 of x * Phi(x) (Hendrycks and Gimpel)
    from scipy.special import erf

    np.testing.assert_allclose(gelu_tanh_np(x), 0.5 * x * (1 + erf(x / math.sqrt(2))), atol=1e-3)


def test_gelu_exact_form_needs_erf():
    """Exact where the DSL has `erf` (a primitive op of its own); a clear error where not."""
    x = RNG.standard_normal((3, 5)) * 3
    if not hasattr(dq, "erf"):
        with pytest.raises(DlvmError, match=r"needs dq\.erf.*approximate=True"):
            dq.gelu(x)
        return
    from scipy.special import erf

    close_everywhere(dq.gelu, lambda a: 0.5 * a * (1 + erf(a / math.sqrt(2))), x)
    gradient_checks(dq.gelu, x)


def layer_norm_np(x, axes, eps, weight=None, bias=None):
    mean = x.mean(axis=axes, keepdims=True)
    out = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    return out * (1 if weight is None else weight) + (0 if bias is None else bias)


@settings(max_examples=25)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data())
def test_layer_norm_drawn_shapes(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = RNG.standard_normal(shape)
    close_everywhere(
        lambda a: dq.layer_norm(a, axis=axis, eps=1e-3),
        lambda a: layer_norm_np(a, axis, 1e-3),
        x,
        targets=["interp"],
    )


def test_layer_norm_with_weight_and_bias_on_cpu():
    x, w, b = RNG.standard_normal((4, 6)), RNG.standard_normal(6), RNG.standard_normal(6)
    close_everywhere(
        lambda a, g, c: dq.layer_norm(a, weight=g, bias=c),
        lambda a, g, c: layer_norm_np(a, -1, 1e-5, g, c),
        x,
        w,
        b,
    )
    close_everywhere(
        lambda a: dq.layer_norm(a, axis=(0, 1)), lambda a: layer_norm_np(a, (0, 1), 1e-5), x
    )
    gradient_checks(lambda a, g, c: dq.layer_norm(a, weight=g, bias=c), x, w, b)


@settings(max_examples=30)
@given(
    shape=st.lists(st.integers(2, 4), min_size=1, max_size=3),
    ddof=st.integers(0, 1),
    keepdims=st.booleans(),
    data=st.data(),
)
def test_var_and_std_drawn_shapes(shape, ddof, keepdims, data):
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    x = RNG.standard_normal(shape)
    for ours, theirs in [(dq.var, np.var), (dq.std, np.std)]:
        close_everywhere(
            lambda a: ours(a, axis=axis, ddof=ddof, keepdims=keepdims),
            lambda a: theirs(a, axis=axis, ddof=ddof, keepdims=keepdims),
            x,
            targets=["interp"],
        )


def test_var_and_std_on_cpu_with_gradients():
    x = RNG.standard_normal((3, 5))
    close_everywhere(lambda a: dq.var(a, axis=1, ddof=1), lambda a: np.var(a, axis=1, ddof=1), x)
    close_everywhere(lambda a: dq.std(a, axis=0), lambda a: np.std(a, axis=0), x)
    gradient_checks(lambda a: dq.var(a, axis=1, ddof=1), x)
    gradient_checks(lambda a: dq.std(a, axis=0), x)
    np.testing.assert_allclose(dq.var(np.array([1, 2, 3, 4], np.int32)), 1.25)
    with pytest.raises(ShapeError, match="ddof 3 leaves no degrees of freedom for 3 elements"):
        dq.var(x, axis=0, ddof=3)


def test_clip_matches_numpy():
    x = RNG.standard_normal((4, 5)) * 2
    x[np.abs(np.abs(x) - 1) < 1e-3] = 0.0  # no element at a kink, for central differences
    close_everywhere(lambda a: dq.clip(a, -1.0, 1.0), lambda a: np.clip(a, -1.0, 1.0), x)
    close_everywhere(
        lambda a: dq.clip(a, a_max=0.5), lambda a: np.minimum(a, 0.5), x, targets=["interp"]
    )
    gradient_checks(lambda a: dq.clip(a, -1.0, 1.0), x)
    with pytest.raises(ShapeError, match="give a_min, a_max or both"):
        dq.clip(x)
