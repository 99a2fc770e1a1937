"""Strided slices end to end: `x[:, ::2]`, `x[1:7:3]` against numpy (interpreter and compiled,
hypothesis-drawn shapes, bounds and steps); the IR's `slice ... by s` and its adjoint
`sliceScatter` (syntax, round trip, located errors); gradients against central differences;
compiled code reading the slice in place; the emulated GPU."""

from __future__ import annotations

import fake_cupy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.codegen.planning.plan import ConcatStep, CopyStep
from dlvm_eq.errors import SourceError
from dlvm_eq.ir import interpret
from dlvm_eq.ir.parser import parse
from dlvm_eq.pipeline import check_grads, compile, plan_function

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def reference_scatter(g, shape, index):
    """The adjoint of x[index]: zeros of `shape` with g added where x[index] read (a loop)."""
    out = np.zeros(shape)
    positions = np.arange(int(np.prod(shape))).reshape(shape)[index]
    for p, v in zip(positions.ravel(), np.asarray(g, np.float64).ravel()):
        out.flat[p] += v
    return out


@st.composite
def strided_index(draw):
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    entries = []
    for n in shape:
        lo = draw(st.integers(0, n - 1))
        hi = draw(st.integers(lo + 1, n + 2))  # past the end is clamped, as numpy does
        entries.append(slice(lo if draw(st.booleans()) else None, hi, draw(st.integers(1, 4))))
    return shape, tuple(entries)


@settings(max_examples=30, **SETTINGS)
@given(strided_index(), st.integers(0, 2**16))
def test_strided_slices_match_numpy(case, seed):
    shape, index = case
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    want = x.astype(np.float64)[index]
    np.testing.assert_array_equal(dq.jit(lambda x: x[index], target="interp")(x), want)
    np.testing.assert_allclose(dq.jit(lambda x: dq.exp(x[index]))(x), np.exp(want), rtol=1e-6)


@settings(max_examples=15, **SETTINGS)
@given(strided_index(), st.integers(0, 2**16))
def test_compiled_gradient_is_the_strided_scatter(case, seed):
    shape, index = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(x[index].shape).astype(np.float32)
    g = dq.jit(dq.grad(lambda x, w: dq.sum(x[index] * w)))(x, w)
    np.testing.assert_allclose(g, reference_scatter(w, shape, index), rtol=1e-6, atol=1e-7)


def test_gradients_match_central_differences():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 6, 5))

    def f(x):
        return dq.sum(dq.tanh(x[1:7:3, ::2]) ** 2) + dq.sum(x[..., 1::2] * x[..., ::2][..., :2])

    checks = check_grads(f, (x,), order=2, rtol=1e-4, atol=1e-6)
    assert [c.order for c in checks] == [1, 2] and all(abs(c.analytic) > 1e-3 for c in checks)


def test_strided_slices_are_read_in_place():
    x = np.zeros((8, 6), np.float32)
    module = dq.make_ir(lambda x: dq.exp(x[1::3, ::2]) + x[::3, 1::2])(x)
    assert "slice %x: <8 x 6 x f32> along 0 from 1 to 8 by 3" in str(module)
    plan = plan_function(module[next(iter(module.functions))], module)
    assert not [s for s in plan.steps if isinstance(s, (CopyStep, ConcatStep))]
    assert len(plan.kernels) == 1  # one kernel reads both strided views of %x


def test_one_entry_slices_and_negative_steps():
    x = np.arange(12.0, dtype=np.float32).reshape(4, 3)
    assert " by " not in str(dq.make_ir(lambda x: x[2::5])(x))  # one entry: a plain slice
    np.testing.assert_array_equal(dq.jit(lambda x: x[2::5])(x), x[2::5])
    for index in (np.s_[:, ::-1], np.s_[3:0:-2, 1::-1], np.s_[::-3]):  # a take of the indices
        assert "take %" in str(dq.make_ir(lambda x, i=index: x[i])(x))
        np.testing.assert_array_equal(dq.jit(lambda x, i=index: x[i])(x), x[index])


# ---------------------------------------------------------------- IR syntax

SRC = """module "m"
stage raw

func @f: (<7 x 3 x f32>) -> <7 x 3 x f32> {
'entry(%x: <7 x 3 x f32>):
    %y = slice %x: <7 x 3 x f32> along 0 from 1 to 7 by 3
    %z = sliceScatter %y: <2 x 3 x f32> along 0 from 1 by 3 into 7
    return %z: <7 x 3 x f32>
}
"""


def test_ir_round_trips_and_means_numpy_slicing():
    m = parse(SRC)
    assert str(m).strip() == SRC.strip()
    x = np.arange(21.0, dtype=np.float32).reshape(7, 3)
    want = np.zeros_like(x)
    want[1:7:3] = x[1:7:3]
    np.testing.assert_array_equal(interpret(m, "f", x), want)
    np.testing.assert_array_equal(compile(m, "f", target="cpu")(x), want)
    plain = parse(
        SRC.replace("from 1 to 7 by 3", "from 1 to 3 by 1").replace(
            "<2 x 3 x f32> along 0 from 1 by 3", "<2 x 3 x f32> along 0 from 1 by 1"
        )
    )
    assert "from 1 to 3\n" in str(plain)  # `by 1` is the plain slice


@pytest.mark.parametrize(
    "old, new, line, column, words",
    [
        ("to 7 by 3", "to 7 by 0", 6, 57, "a slice step must be positive"),
        (
            "from 1 by 3 into 7",
            "from 1 by 3 into 4",
            7,
            66,
            "2 entries from 1 by 3 do not fit in size 4",
        ),
        ("from 1 by 3 into 7", "from 1 by 0 into 7", 7, 59, "a slice step must be positive"),
        ("along 0 from 1 by", "along 2 from 1 by", 7, 47, "axis 2 out of range"),
    ],
)
def test_bad_attributes_are_located_parse_errors(old, new, line, column, words):
    with pytest.raises(SourceError) as info:
        parse(SRC.replace(old, new, 1), "m.dl")
    e = info.value
    assert (e.filename, e.line, e.column) == ("m.dl", line, column), e.message
    assert words in e.message


# ---------------------------------------------------------------- GPU, emulated


def test_strided_gradient_on_the_emulated_gpu_matches_the_cpu(monkeypatch):
    x = np.random.default_rng(2).standard_normal((9, 6)).astype(np.float32)
    vg = dq.value_and_grad(lambda x: dq.sum(dq.tanh(x[1::3, ::2]) * x[::3, 1::2]))
    module = vg.lower(x)
    name = next(iter(module.functions))
    cpu = compile(module, name, target="cpu")(x)
    with fake_cupy.installed(monkeypatch, sms=2) as cp:
        gpu = compile(module, name, target="gpu")(cp.asarray(x))
    assert len(gpu) == len(cpu) == 2
    for g, c in zip(gpu, cpu):
        np.testing.assert_allclose(g.get(), c, rtol=1e-5, atol=1e-6)
