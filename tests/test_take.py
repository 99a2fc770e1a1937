"""take / gather and its adjoint scatterAdd end to end: `dq.take(x, ids, axis)` and `x[ids]`
against float64 numpy fancy indexing (interpreter and compiled, hypothesis-drawn shapes, axes
and repeated indices); gradients against central differences, with repeated indices
accumulating; out-of-range indices (the same error in the interpreter and on the CPU); the
IR syntax (round trip, located errors); the emulated GPU."""

from __future__ import annotations

import fake_cupy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.errors import DlvmError, SourceError
from dlvm_eq.ir import interpret
from dlvm_eq.ir.parser import parse
from dlvm_eq.pipeline import check_grads, compile

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def reference_take(x, ids, axis):
    """np.take spelled with basic indexing: one slice per index, stacked."""
    x = np.asarray(x, np.float64)
    rows = [x[(slice(None),) * axis + (int(i),)] for i in np.ravel(ids)]
    out = np.stack(rows, axis=axis)
    return out.reshape(x.shape[:axis] + np.shape(ids) + x.shape[axis + 1 :])


def reference_scatter_add(g, ids, axis, size):
    """The adjoint of take, by a Python loop over the indices."""
    g = np.asarray(g, np.float64).reshape(g.shape[:axis] + (-1,) + g.shape[axis + np.ndim(ids) :])
    out = np.zeros(g.shape[:axis] + (size,) + g.shape[axis + 1 :])
    for j, i in enumerate(np.ravel(ids)):
        out[(slice(None),) * axis + (int(i),)] += g[(slice(None),) * axis + (j,)]
    return out


@st.composite
def take_cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    ids_shape = tuple(draw(st.lists(st.integers(1, 4), max_size=2)))
    ids = np.array(
        draw(
            st.lists(
                st.integers(0, n - 1),
                min_size=int(np.prod(ids_shape)),
                max_size=int(np.prod(ids_shape)),
            )
        ),
        np.int32,
    ).reshape(ids_shape)
    return shape, axis, ids


@settings(max_examples=30, **SETTINGS)
@given(take_cases(), st.integers(0, 2**16))
def test_take_matches_numpy_in_the_interpreter_and_compiled(case, seed):
    shape, axis, ids = case
    x = np.random.default_rng(seed).standard_normal(shape)
    want = reference_take(x, ids, axis % len(shape))
    got = dq.jit(lambda x, i: dq.take(x, i, axis=axis), target="interp")(x, ids)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    x32 = x.astype(np.float32)
    got = dq.jit(lambda x, i: dq.take(x, i, axis=axis) * 2.0)(x32, ids)
    np.testing.assert_allclose(got, 2.0 * reference_take(x32, ids, axis % len(shape)), rtol=1e-6)


@settings(max_examples=15, **SETTINGS)
@given(take_cases(), st.integers(0, 2**16))
def test_compiled_gradient_is_the_scatter_add(case, seed):
    """d/dx sum(take(x, ids) * w) = scatter-add of w: repeated indices accumulate."""
    shape, axis, ids = case
    axis %= len(shape)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[:axis] + ids.shape + shape[axis + 1 :]).astype(np.float32)
    g = dq.jit(dq.grad(lambda x, i, w: dq.sum(dq.take(x, i, axis=axis) * w)))(x, ids, w)
    np.testing.assert_allclose(
        g, reference_scatter_add(w, ids, axis, shape[axis]), rtol=1e-5, atol=1e-6
    )


def test_repeated_indices_accumulate_in_the_gradient():
    emb = np.arange(12.0).reshape(4, 3)
    ids = np.array([[1, 1, 3], [1, 0, 3]], np.int32)
    g = dq.jit(dq.grad(lambda e, i: dq.sum(e[i])))(emb.astype(np.float32), ids)
    np.testing.assert_array_equal(g, [[1, 1, 1], [3, 3, 3], [0, 0, 0], [2, 2, 2]])


def test_gradients_match_central_differences():
    rng = np.random.default_rng(1)
    emb, x = rng.standard_normal((5, 3)), rng.standard_normal((4, 6))
    ids, cols = np.array([[4, 0], [4, 2]], np.int32), np.array([5, 1, 5, 5], np.int32)
    embed = lambda e, x: (
        dq.sum(dq.tanh(e[ids]) ** 2) + dq.sum(dq.sin(dq.take(x, cols, axis=1)) * x[:, :4])
    )
    checks = check_grads(embed, (emb, x), order=2, rtol=1e-4, atol=1e-6)
    assert [c.order for c in checks] == [1, 2] and all(abs(c.analytic) > 1e-3 for c in checks)


def test_scalar_index_tensor_reads_one_entry():
    x = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    f = dq.jit(lambda x, i: x[i])
    np.testing.assert_array_equal(f(x, np.array(2, np.int32)), x[2])
    assert "take %x" in str(dq.make_ir(lambda x, i: x[i])(x, np.array(2, np.int32)))


# ---------------------------------------------------------------- out-of-range indices


def test_out_of_range_indices_are_the_same_error_in_the_interpreter_and_compiled():
    x = np.arange(10.0, dtype=np.float32).reshape(5, 2)
    ids = np.array([0, 7, -2], np.int32)
    message = r"take: index 7 \(position 1\) is out of range for an axis of size 5"
    for target in ("interp", "cpu"):
        with pytest.raises(DlvmError, match=message):
            dq.jit(lambda x, i: x[i], target=target)(x, ids)
    with pytest.raises(
        DlvmError, match=r"index -2 \(position 0\) is out of range for an axis of size 5"
    ):
        dq.jit(lambda x, i: x[i])(x, np.array([-2, 1], np.int32))
    with pytest.raises(DlvmError, match="out of range for an axis of size 5"):  # the scatter too
        dq.jit(dq.grad(lambda x, i: dq.sum(x[i])))(x, ids)
    np.testing.assert_array_equal(
        dq.jit(lambda x, i: x[i])(x, np.array([4, 0], np.int32)), x[[4, 0]]
    )


def test_dsl_errors_for_bad_indices():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(dq.ShapeError, match="index 3 is out of range for axis 0 with size 3"):
        dq.make_ir(lambda x: x[np.array([0, 3])])(x)  # known at trace time
    with pytest.raises(dq.ShapeError, match="indices must be integers, got a tensor of f32"):
        dq.make_ir(lambda x, i: dq.take(x, i))(x, np.zeros(2, np.float32))
    with pytest.raises(dq.ShapeError, match="take: axis 2 is out of range"):
        dq.make_ir(lambda x, i: dq.take(x, i, axis=2))(x, np.zeros(2, np.int32))
    with pytest.raises(DlvmError, match="out of range"):
        dq.take(x, np.array([5]))  # eagerly, on numpy arrays


def test_symbolic_semantics_with_concrete_indices_match_numpy():
    import sympy as sp

    from dlvm_eq.ir import F32, I32, tensor
    from dlvm_eq.ir.ops import OPS
    from dlvm_eq.verify import apply_op, symbol_array

    ids = np.array([2, 0, 2], np.int32)
    x = symbol_array("x", (3, 2), F32)
    idx = np.array([sp.Integer(int(i)) for i in ids], dtype=object)
    got = apply_op(
        "take",
        [x, idx],
        {"axis": 0},
        OPS["take"].result_type([tensor(3, 2, F32), tensor(3, I32)], {"axis": 0}),
    )
    assert (got == x[ids]).all()
    attrs = {"axis": 0, "size": 4}
    back = apply_op(
        "scatterAdd",
        [got, idx],
        attrs,
        OPS["scatterAdd"].result_type([tensor(3, 2, F32), tensor(3, I32)], attrs),
    )
    assert (
        back[2, 1] == 2 * x[2, 1] and back[0, 0] == x[0, 0] and back[1, 0] == 0 and back[3, 1] == 0
    )


# ---------------------------------------------------------------- IR syntax

SRC = """module "m"
stage raw

func @f: (<5 x 3 x f32>, <4 x i32>) -> <5 x 3 x f32> {
'entry(%x: <5 x 3 x f32>, %ids: <4 x i32>):
    %y = take %x: <5 x 3 x f32>, %ids: <4 x i32> along 0
    %z = scatterAdd %y: <4 x 3 x f32>, %ids: <4 x i32> along 0 into 5
    return %z: <5 x 3 x f32>
}
"""


def test_ir_round_trips_and_means_take_then_scatter_add():
    m = parse(SRC)
    assert str(m).strip() == SRC.strip()
    x = np.arange(15.0, dtype=np.float32).reshape(5, 3)
    ids = np.array([0, 2, 2, 4], np.int32)
    want = reference_scatter_add(reference_take(x, ids, 0), ids, 0, 5)
    np.testing.assert_array_equal(interpret(m, "f", x, ids), want)
    np.testing.assert_array_equal(compile(m, "f", target="cpu")(x, ids), want)


@pytest.mark.parametrize(
    "old, new, column, words",
    [
        ("<4 x i32> along 0\n", "<4 x i32> along 2\n", 56, "axis 2 out of range"),  # at the axis
        (
            "%ids: <4 x i32> along 0\n",
            "%x: <5 x 3 x f32> along 0\n",
            10,
            "indices must be a non-empty vector of i32",
        ),
        ("along 0 into 5", "along 0 into 0", 69, "must be positive"),  # at the size
        ("along 0 into 5", "along 0 into x", 69, "expected a number"),
    ],
)
def test_bad_attributes_are_located_parse_errors(old, new, column, words):
    with pytest.raises(SourceError) as info:
        parse(SRC.replace(old, new, 1), "m.dl")
    e = info.value
    assert e.filename == "m.dl" and words in e.message
    assert e.line in (6, 7) and e.column == column, (e.line, e.column, e.message)


# ---------------------------------------------------------------- GPU, emulated


def test_take_and_its_gradient_on_the_emulated_gpu_match_the_cpu(monkeypatch):
    rng = np.random.default_rng(2)
    emb = rng.standard_normal((6, 4)).astype(np.float32)
    ids = np.array([[5, 1, 1], [0, 5, 3]], np.int32)  # in range: the CPU raises otherwise
    vg = dq.value_and_grad(lambda e, i: dq.sum(dq.tanh(e[i]) * 1.5))
    module = vg.lower(emb, ids)
    name = next(iter(module.functions))
    cpu = compile(module, name, target="cpu")(emb, ids)
    with fake_cupy.installed(monkeypatch, sms=2) as cp:
        gpu = compile(module, name, target="gpu")(cp.asarray(emb), cp.asarray(ids))
    assert len(gpu) == len(cpu) == 2
    for g, c in zip(gpu, cpu):
        np.testing.assert_allclose(g.get(), c, rtol=1e-5, atol=1e-6)


SCATTER_ONLY = """module "m"
stage raw

func @f: (<4 x 3 x f32>, <4 x i32>) -> <5 x 3 x f32> {
'entry(%g: <4 x 3 x f32>, %ids: <4 x i32>):
    %z = scatterAdd %g: <4 x 3 x f32>, %ids: <4 x i32> along 0 into 5
    return %z: <5 x 3 x f32>
}
"""


def test_out_of_range_indices_are_the_interpreters_error_on_the_emulated_gpu(monkeypatch):
    """The GPU's CuPy gathers clamp ids (no launch leaves a buffer): the program must still
    raise the interpreter's error, not return the edge rows (a result the CPU never gives)."""
    emb = np.arange(24.0, dtype=np.float32).reshape(6, 4)
    good = np.array([[5, 1, 1], [0, 5, 3]], np.int32)
    vg = dq.value_and_grad(lambda e, i: dq.sum(dq.tanh(e[i]) * 1.5))
    module = vg.lower(emb, good)
    name = next(iter(module.functions))
    scatter = parse(SCATTER_ONLY)
    g = np.ones((4, 3), np.float32)
    with fake_cupy.installed(monkeypatch, sms=2) as cp:
        step = compile(module, name, target="gpu")
        scatter_gpu = compile(scatter, "f", target="gpu")
        for bad, words in (
            ([[5, 1, 6], [0, 5, 3]], r"index 6 \(position 2\)"),
            ([[5, 1, 1], [-1, 5, 3]], r"index -1 \(position 3\)"),
        ):
            bad = np.array(bad, np.int32)
            for run in (
                lambda: interpret(module, name, emb, bad),
                lambda: compile(module, name, target="cpu")(emb, bad),
            ):
                with pytest.raises(
                    DlvmError, match=f"take: {words} is out of range for an axis of size 6"
                ):
                    run()
            with pytest.raises(
                DlvmError, match=f"take: {words} is out of range for an axis of size 6"
            ):
                step(cp.asarray(emb), cp.asarray(bad))
        with pytest.raises(
            DlvmError,
            match=r"scatterAdd: index 5 \(position 1\) is out of range for an axis of size 5",
        ):
            scatter_gpu(cp.asarray(g), cp.asarray(np.array([0, 5, 2, 2], np.int32)))
        ok = scatter_gpu(cp.asarray(g), cp.asarray(np.array([0, 4, 2, 2], np.int32)))  # still runs
        np.testing.assert_array_equal(
            ok.get(), interpret(scatter, "f", g, np.array([0, 4, 2, 2], np.int32))
        )
        value, grad = step(cp.asarray(emb), cp.asarray(good))
        np.testing.assert_allclose(
            value.get(), compile(module, name, target="cpu")(emb, good)[0], rtol=1e-5
        )
