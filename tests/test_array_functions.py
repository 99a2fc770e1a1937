"""argmax, argmin, clip and pad (DSL compositions of existing ops, dsl/arrays.py) against numpy
in the interpreter and compiled, with hypothesis-drawn shapes, ties and NaNs; their gradients
against central differences (argmax/argmin: none, their results are integers); errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.pipeline import check_grads

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def arrays_with_ties(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    seed = draw(st.integers(0, 2**16))
    x = np.random.default_rng(seed).integers(-3, 4, shape).astype(np.float32)  # many ties
    if draw(st.booleans()):
        x.flat[draw(st.integers(0, x.size - 1))] = np.nan
    return x, draw(st.sampled_from([None] + list(range(-len(shape), len(shape)))))


@settings(max_examples=25, **SETTINGS)
@given(arrays_with_ties(), st.sampled_from(["interp", "cpu"]))
def test_argmax_argmin_match_numpy_first_index_and_nan(case, target):
    x, axis = case
    f = dq.jit(
        lambda x: (dq.argmax(x, axis=axis), dq.argmin(x, axis=axis, keepdims=axis is not None)),
        target=target,
    )
    amax, amin = f(x)
    assert amax.dtype == np.int32
    np.testing.assert_array_equal(amax, np.argmax(x, axis=axis))
    want = np.argmin(x, axis=axis)
    np.testing.assert_array_equal(amin, want if axis is None else np.expand_dims(want, axis))


def test_argmax_has_no_gradient():
    x = np.random.default_rng(0).standard_normal((3, 4))
    g = dq.grad(lambda x: dq.sum(dq.astype(dq.argmax(x, axis=1), "f64") * 3.0) + dq.sum(x * x))(x)
    np.testing.assert_allclose(g, 2 * x)  # only the x * x term: the index path carries nothing


@st.composite
def pad_cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    widths = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in shape)
    form = draw(st.integers(0, 2))
    if form == 1:
        widths = widths[0]  # one (before, after) for every axis
    elif form == 2:
        widths = widths[0][0]  # one int
    return shape, widths, draw(st.sampled_from([0.0, -1.5, 7.0]))


@settings(max_examples=25, **SETTINGS)
@given(pad_cases(), st.sampled_from(["interp", "cpu"]))
def test_pad_matches_numpy(case, target):
    shape, widths, c = case
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got = dq.jit(lambda x: dq.pad(x, widths, constant_values=c), target=target)(x)
    np.testing.assert_array_equal(got, np.pad(x, widths, constant_values=c))


@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_clip_matches_numpy(target):
    x = np.linspace(-3, 3, 41).astype(np.float32).reshape(1, 41)
    lo, hi = -1.0, np.full((1, 41), 2.0, np.float32)
    got = dq.jit(
        lambda x, hi: (dq.clip(x, lo, hi), dq.clip(x, a_min=0.5), dq.clip(x, a_max=-0.5)),
        target=target,
    )(x, hi)
    for g, w in zip(got, (np.clip(x, lo, hi), np.clip(x, 0.5, None), np.clip(x, None, -0.5))):
        np.testing.assert_array_equal(g, w)


def test_gradients_match_central_differences():
    x = np.random.default_rng(2).standard_normal((3, 4))
    f = lambda x: (
        dq.sum(dq.pad(dq.tanh(x), ((1, 0), (2, 1)), constant_values=2.0) ** 2)
        + dq.sum(dq.clip(x, -0.3, 0.4) ** 2)
    )
    checks = check_grads(f, (x,), order=2, rtol=1e-4, atol=1e-6)
    assert [c.order for c in checks] == [1, 2] and all(abs(c.analytic) > 1e-3 for c in checks)


def test_bad_arguments_are_shape_errors():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(dq.ShapeError, match="mode 'reflect' is not supported"):
        dq.make_ir(lambda x: dq.pad(x, 1, mode="reflect"))(x)
    with pytest.raises(dq.ShapeError, match="does not fit 2 axes"):
        dq.make_ir(lambda x: dq.pad(x, ((1, 1), (1, 1), (1, 1))))(x)
    with pytest.raises(dq.ShapeError, match="non-negative integers"):
        dq.make_ir(lambda x: dq.pad(x, -1))(x)
    with pytest.raises(dq.ShapeError, match="give a_min, a_max or both"):
        dq.make_ir(lambda x: dq.clip(x))(x)
    with pytest.raises(dq.ShapeError, match="argmax: axis 2 is out of range"):
        dq.make_ir(lambda x: dq.argmax(x, axis=2))(x)


# ---------------------------------------------------------------- cumsum (an IR op)


@st.composite
def cumsum_cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    return (
        shape,
        draw(st.sampled_from([None] + list(range(-len(shape), len(shape))))),
        draw(st.booleans()),
    )


@settings(max_examples=25, **SETTINGS)
@given(cumsum_cases(), st.sampled_from(["interp", "cpu"]))
def test_cumsum_matches_numpy(case, target):
    shape, axis, reverse = case
    x = np.random.default_rng(3).standard_normal(shape)
    flat = x.ravel() if axis is None else x
    k = 0 if axis is None else axis
    want = np.flip(np.cumsum(np.flip(flat, k), axis=k), k) if reverse else np.cumsum(flat, axis=k)
    got = dq.jit(lambda x: dq.cumsum(x, axis=axis, reverse=reverse), target=target)(
        x.astype(np.float32)
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ints = (x * 3).astype(np.int32)
    np.testing.assert_array_equal(
        dq.jit(lambda x: dq.cumsum(x, axis=axis), target=target)(ints),
        np.cumsum(ints.ravel() if axis is None else ints, axis=k).astype(np.int32),
    )


def test_cumsum_gradient_is_the_reverse_cumsum():
    x = np.random.default_rng(4).standard_normal((3, 5))
    checks = check_grads(
        lambda x: (
            dq.sum(dq.tanh(dq.cumsum(x, axis=1)) ** 2)
            + dq.sum(dq.cumsum(x, axis=0, reverse=True) ** 2)
        ),
        (x,),
        order=2,
        rtol=1e-4,
        atol=1e-6,
    )
    assert [c.order for c in checks] == [1, 2]
    w = np.random.default_rng(5).standard_normal((3, 5)).astype(np.float32)
    g = dq.jit(dq.grad(lambda x, w: dq.sum(dq.cumsum(x, axis=1) * w)))(x.astype(np.float32), w)
    np.testing.assert_allclose(g, np.flip(np.cumsum(np.flip(w, 1), 1), 1), rtol=1e-5, atol=1e-6)


def test_cumsum_ir_round_trips_and_bad_axes_are_located():
    from dlvm_eq.errors import SourceError
    from dlvm_eq.ir.parser import parse

    src = """module "m"
stage raw

func @f: (<3 x 4 x f32>) -> <3 x 4 x f32> {
'entry(%x: <3 x 4 x f32>):
    %y = cumsum %x: <3 x 4 x f32> along 1
    %z = cumsum %y: <3 x 4 x f32> along 0 reverse
    return %z: <3 x 4 x f32>
}
"""
    m = parse(src)
    assert str(m).strip() == src.strip()
    with pytest.raises(SourceError) as info:
        parse(src.replace("along 1", "along 2"), "m.dl")
    assert (info.value.line, info.value.column) == (
        6,
        41,
    ) and "axis 2 out of range" in info.value.message


def test_cumsum_gradient_on_the_emulated_gpu_matches_the_cpu(monkeypatch):
    import fake_cupy

    from dlvm_eq.pipeline import compile

    x = np.random.default_rng(6).standard_normal((4, 6)).astype(np.float32)
    module = dq.value_and_grad(lambda x: dq.sum(dq.tanh(dq.cumsum(x, axis=1)) * x)).lower(x)
    name = next(iter(module.functions))
    cpu = compile(module, name, target="cpu")(x)
    with fake_cupy.installed(monkeypatch, sms=2) as cp:
        gpu = compile(module, name, target="gpu")(cp.asarray(x))
    for g, c in zip(gpu, cpu):
        np.testing.assert_allclose(g.get(), c, rtol=1e-5, atol=1e-6)
