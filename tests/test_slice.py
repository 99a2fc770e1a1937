"""The slice op end to end: IR syntax and its errors, the DSL's basic indexing and split against
numpy (interpreter and compiled), gradients through slices and concatenations against finite
differences, and what the slice op saved in concatenate's adjoint."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.ad.flops import program_flops
from dlvm_eq.errors import IRError, SourceError
from dlvm_eq.ir import F32, FunctionBuilder, Module, interpret, tensor
from dlvm_eq.ir.parser import parse
from dlvm_eq.ir.verifier import verify
from dlvm_eq.pipeline import check_grads

SRC = """module "m"
stage raw

func @f: (<4 x 8 x f32>) -> <4 x 4 x f32> {
'entry(%x: <4 x 8 x f32>):
    %y = slice %x: <4 x 8 x f32> along 1 from 2 to 6
    return %y: <4 x 4 x f32>
}
"""
X = np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5) - 50.0


# ---------------------------------------------------------------- IR syntax


def test_slice_round_trips_and_means_numpy_slicing():
    m = parse(SRC)
    assert str(m).strip() == SRC.strip()
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(interpret(m, "f", x), x[:, 2:6])


@pytest.mark.parametrize(
    "bounds, column, words",
    [
        ("along 1 from 2 to 9", 52, "slice end 9 is outside axis 1"),
        ("along 1 from 8 to 9", 47, "slice start 8 is outside axis 1"),
        ("along 1 from 6 to 2", 52, "empty slice"),
        ("along 1 from 3 to 3", 52, "empty slice"),
        ("along 1 from -1 to 2", 47, "non-negative integer"),
        ("along 2 from 0 to 1", 40, "axis 2 out of range"),
    ],
)
def test_bad_bounds_are_located_parse_errors(bounds, column, words):
    with pytest.raises(SourceError) as info:
        parse(SRC.replace("along 1 from 2 to 6", bounds), "m.dl")
    e = info.value
    assert (e.filename, e.line, e.column) == ("m.dl", 6, column)
    assert words in e.message


def test_verifier_checks_slice_bounds_and_result_type():
    b = FunctionBuilder("f", [tensor(4, 8, F32)])
    y = b.emit("slice", [b.params[0]], axis=1, lo=2, hi=6)
    fn = b.finish(y)
    fn.body[0].attrs["hi"] = 9  # as a buggy pass could leave it
    m = Module("m")
    m.add(fn)
    with pytest.raises(IRError, match=r"%0: slice: range 2 to 9 is empty or outside axis 1"):
        verify(m)
    fn.body[0].attrs["hi"] = 5  # in range, but the declared type is 4 wide
    with pytest.raises(IRError, match=r"declared <4 x 4 x f32> but slice gives <4 x 3 x f32>"):
        verify(m)


# ---------------------------------------------------------------- DSL indexing

INDICES = [
    np.s_[0],
    np.s_[-1],
    np.s_[1:3],
    np.s_[:, 2:6],
    np.s_[..., :2],
    np.s_[None],
    np.s_[:, None, -2],
    np.s_[1, ..., None],
    np.s_[-3:],
    np.s_[:100],
    np.s_[2, 3, 4],
    np.s_[...],
    np.s_[:, -100:2],
    np.s_[None, ..., None, 0],
    np.s_[:, :, 4:],
]


@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_indexing_matches_numpy(target):
    f = dq.jit(lambda x: tuple(x[ix] * 2.0 for ix in INDICES), target=target)
    for got, ix in zip(f(X), INDICES):
        want = X[ix] * 2.0
        assert got.shape == want.shape, ix
        np.testing.assert_array_equal(got, want)


def test_integer_index_is_a_slice_and_a_squeeze():
    text = str(dq.make_ir(lambda x: x[1, ..., None])(X))
    assert "slice %x: <4 x 6 x 5 x f32> along 0 from 1 to 2" in text
    assert "squeezeShape" in text and "padShape" in text
    assert "slice" not in str(dq.make_ir(lambda x: x[:, :, :] + x[...])(X))  # whole axes: no op


def test_iteration_and_split_match_numpy():
    rows = dq.jit(lambda x: tuple(r for r in x))(X)
    assert len(rows) == 4 and all(np.array_equal(r, x) for r, x in zip(rows, X))
    for spec, axis in ((3, 1), ([1, -2], -1), ([2], 0)):
        got = dq.jit(lambda x: tuple(dq.split(x, spec, axis=axis)))(X)
        want = np.split(X, spec, axis=axis)
        assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))
    eager = dq.split(X, [2], axis=0)  # numpy arrays in, numpy arrays out
    assert all(np.array_equal(g, w) for g, w in zip(eager, np.split(X, [2], axis=0)))


@pytest.mark.parametrize(
    "index, words",
    [
        (np.s_[::0], "slice step 0 on axis 0 is not supported"),
        (np.s_[[0, 1]], "with list [0, 1] is not supported"),
        (np.s_[True], "with a bool is not supported"),
        (np.s_[4], "index 4 is out of bounds for axis 0 with size 4"),
        (np.s_[:, -7], "index -7 is out of bounds for axis 1 with size 6"),
        (np.s_[2:2], "the slice 2:2 of axis 0 (size 4) is empty"),
        (np.s_[0, 0, 0, 0], "too many indices for shape (4, 6, 5)"),
        (np.s_[..., ...], "a single ellipsis"),
    ],
)
def test_bad_indices_are_shape_errors_at_the_users_line(index, words):
    with pytest.raises(dq.ShapeError) as info:
        dq.make_ir(lambda x: x[index])(X)  # <- the user's line
    assert words in str(info.value)
    assert f"{__file__}:" in str(info.value) and "<- the user's line" in str(info.value)


def test_split_errors():
    with pytest.raises(dq.ShapeError, match="does not divide into 4 equal parts"):
        dq.make_ir(lambda x: dq.split(x, 4, axis=1))(X)
    with pytest.raises(dq.ShapeError, match="axis 3 out of range"):
        dq.make_ir(lambda x: dq.split(x, 2, axis=3))(X)


# ---------------------------------------------------------------- gradients


def _gates(x, w):
    """An LSTM-style split of one matmul into gates, with a concatenation."""
    i, f, o, g = dq.split(x @ w, 4, axis=1)
    h = dq.sigmoid(i) * dq.tanh(g) + dq.sigmoid(f) * x[:, :3]
    return dq.sum(dq.concatenate([h, dq.tanh(o)[:, 1:]], axis=1) ** 2)


def test_gradients_through_slices_and_concatenations_match_finite_differences():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((5, 4)), rng.standard_normal((4, 12))
    # check_grads raises GradientCheckError on a disagreement (orders 1 and 2)
    checks = check_grads(_gates, (x, w), order=2, rtol=1e-4, atol=1e-6)
    assert [c.order for c in checks] == [1, 2] and all(abs(c.analytic) > 1e-3 for c in checks)
    cube = rng.standard_normal((3, 4, 5))
    checks = check_grads(
        lambda c: dq.sum(dq.exp(c[1, :, 2:]) * c[-1, :, None, 0]),
        (cube,),
        order=2,
        rtol=1e-4,
        atol=1e-6,
    )
    assert all(abs(c.analytic) > 1e-3 for c in checks)


def test_compiled_gradient_matches_the_interpreter():
    rng = np.random.default_rng(2)
    x, w = (
        rng.standard_normal((5, 4)).astype(np.float32),
        rng.standard_normal((4, 12)).astype(np.float32),
    )
    vg = dq.value_and_grad(_gates, argnums=(0, 1))
    (v, gs), (v0, gs0) = dq.jit(vg)(x, w), dq.jit(vg, target="interp")(x, w)
    np.testing.assert_allclose(v, v0, rtol=1e-5)
    for g, g0 in zip(gs, gs0):
        np.testing.assert_allclose(g, g0, rtol=1e-4, atol=1e-5)


def test_concatenate_adjoint_is_slices():
    """The adjoint of concatenate slices g (it was a one-hot mask and a sum: 19 ops, 3n work)."""

    def f(a, b):
        return dq.sum(dq.concatenate([a * a, b], 0))

    a, b = np.ones((64, 32), np.float32), np.ones((32, 32), np.float32)
    module = dq.make_ir(dq.grad(f, argnums=(0, 1)))(a, b)
    fn = next(iter(module.functions.values()))
    counts = program_flops(fn)
    # no concatenation left: the forward's own is dead in a gradient (dq.grad drops it), and
    # the adjoint's slices of g (ones) fold
    assert counts["ops"] <= 5 and "concatenate" not in counts, counts
    assert counts["flops"] <= 64 * 32 * 2 + 96 * 32 + 64 * 32, counts


def test_gradient_of_a_split_joins_its_parts_without_zero_padding():
    """Each part's adjoint is g padded with zeros; associativity of concatenation and
    concat+concat join the four padded parts into one concatenation of the parts."""
    from collections import Counter

    def loss(z):
        i, f, o, g = dq.split(z, 4, axis=1)
        return dq.sum(dq.sigmoid(i) * dq.tanh(g) + dq.sigmoid(f) * dq.sigmoid(o))

    z = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    fn = next(iter(dq.make_ir(dq.grad(loss))(z).functions.values()))
    ops = Counter(i.op for i in fn.body)
    assert ops["concatenate"] == 3 and ops["broadcast"] == 0, ops
    check_grads(loss, (z.astype(np.float64),))


def _arena_is_sound(plan):
    """No two temporaries share bytes while both are live; reading an alias keeps the slot it
    aliases live (checked independently of schedule.arena)."""
    from dlvm_eq.codegen.planning.plan import TEMP, AliasStep, step_inputs, step_outputs

    source = {s.out: s.src for s in plan.steps if isinstance(s, AliasStep)}

    def root(s):
        while s in source:
            s = source[s]
        return s

    live = {}
    for i, step in enumerate(plan.steps):
        for s in step_outputs(step):
            live.setdefault(s, [i, i])
        for s in step_inputs(step):
            r = root(s)
            if r in live:
                live[r][1] = i
    temps = [s for s in plan.slots if s.role == TEMP and s.index in plan.offsets]
    for a in temps:
        for b in temps:
            if a.index < b.index:
                (a0, a1), (b0, b1) = live[a.index], live[b.index]
                oa, ob = plan.offsets[a.index], plan.offsets[b.index]
                bytes_overlap = oa < ob + b.nbytes and ob < oa + a.nbytes
                time_overlap = a0 <= b1 and b0 <= a1
                assert not (bytes_overlap and time_overlap), (a, b, live[a.index], live[b.index])


def test_slices_are_read_in_place_and_keep_their_buffer_alive():
    from dlvm_eq.codegen.planning.plan import AliasStep, CopyStep

    def f(x, w, w2, w3):
        t = dq.exp(x @ w)
        s = t[:, 1:]  # read in place, late in the program
        a = dq.tanh(x @ w * 3.0)
        b = dq.sigmoid(a @ w2)  # bigger than t: it would take t's bytes
        c = dq.relu(b @ w3)
        return dq.sum(s * a[:, 1:] + c[:, 1:], axis=1)

    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    w = (0.3 * rng.standard_normal((8, 8))).astype(np.float32)
    w2 = (0.3 * rng.standard_normal((8, 32))).astype(np.float32)
    w3 = (0.3 * rng.standard_normal((32, 8))).astype(np.float32)
    jf = dq.jit(f)
    got = jf(x, w, w2, w3)
    plan = jf.report(x, w, w2, w3).plan
    assert any(isinstance(s, AliasStep) for s in plan.steps)
    assert not any(isinstance(s, CopyStep) for s in plan.steps)  # no slice is copied
    _arena_is_sound(plan)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    t = np.exp(x64 @ w64)
    a = np.tanh(x64 @ w64 * 3.0)
    c = np.maximum((1 / (1 + np.exp(-(a @ w2.astype(np.float64))))) @ w3.astype(np.float64), 0)
    np.testing.assert_allclose(got, np.sum(t[:, 1:] * a[:, 1:] + c[:, 1:], axis=1), rtol=1e-4)


def test_views_of_temporaries_are_made_once_per_arena_and_views_of_arguments_per_call():
    """The executor makes a view of a temporary once, with the arena (the step never runs, is
    timed and priced 0), and a view of an argument at every call: results follow each call's
    arguments, from many threads at once (each call its own arena)."""
    from at_once import run_at_once

    from dlvm_eq.calibration.plan_cost import predict_plan
    from dlvm_eq.codegen.planning.plan import PARAM, AliasStep, arena_aliases

    def f(x, w):
        t = dq.exp(x @ w)
        return dq.tanh(x[1:, :] * 2.0) @ w + t[1:, :] * x[:-1, :]

    def want(x, w):
        x, w = x.astype(np.float64), w.astype(np.float64)
        return np.tanh(x[1:] * 2.0) @ w + np.exp(x @ w)[1:] * x[:-1]

    rng = np.random.default_rng(7)
    w = (0.3 * rng.standard_normal((8, 8))).astype(np.float32)
    xs = [rng.standard_normal((16, 8)).astype(np.float32) for _ in range(6)]
    jf = dq.jit(f)
    plan = jf.report(xs[0], w).plan
    aliases = {i: s for i, s in enumerate(plan.steps) if isinstance(s, AliasStep)}
    made = arena_aliases(plan)
    assert made and made < set(aliases)  # both kinds are in this program
    assert all(plan.slots[aliases[i].src].role != PARAM for i in made)
    assert all(plan.slots[aliases[i].src].role == PARAM for i in set(aliases) - made)
    prediction = predict_plan(plan, "cpu")
    assert all(prediction.steps[i].seconds == 0.0 for i in made)
    assert all(prediction.steps[i].seconds > 0.0 for i in set(aliases) - made)
    from dlvm_eq.codegen import program

    compiled = program(plan, "cpu")
    out, seconds = compiled.timed_call(xs[1], w)
    np.testing.assert_allclose(out, want(xs[1], w), rtol=1e-4, atol=1e-5)
    assert all(seconds[i] == 0.0 for i in made) and all(
        seconds[i] > 0.0 for i in set(aliases) - made
    )
    for x in xs:  # one arena, new arguments each call
        np.testing.assert_allclose(jf(x, w), want(x, w), rtol=1e-4, atol=1e-5)

    def worker(k):
        for i in range(40):
            x = xs[(i + k) % len(xs)]
            np.testing.assert_allclose(jf(x, w), want(x, w), rtol=1e-4, atol=1e-5)

    errors = run_at_once(worker, n=4)
    assert not errors, errors[0]
