"""Multi-output fusion of maps with reductions (issue 36): a map and the reductions over its
iteration space, along any axes (leading ones too), in one pass (MapReduceSpec, MapReduceStep),
where the fusion stage prices it cheaper (egraph/fusion_decision.py: `shared_pass`).

- the kernel against its numpy oracle (float64), and bit-identical with 1 to 4 threads;
- fires: a conv's bias gradient with the ReLU-adjoint select, batch norm's two moments over
  (N, H, W), the sum of a softmax along a leading axis with its exp;
- does not fire: a reduction whose result the map reads, a map output read at another order,
  the GPU target, DLVM_EQ_MULTI_OUTPUT=0 (reductions over different axes share a pass);
- random programs of maps and reductions agree with the interpreter (float64), hypothesis.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq import config
from dlvm_eq.codegen import plan_schema, set_cache_dir
from dlvm_eq.codegen.kernels.kernel_spec import KernelInput, ReduceSpec
from dlvm_eq.codegen.kernels.map_reduce import MapReduceSpec, evaluate_map_reduce
from dlvm_eq.codegen.kernels.spec import Const, KernelError, Load, Select, binary, unary
from dlvm_eq.codegen.planning.plan import MapReduceStep
from dlvm_eq.codegen.runtime.map_reduce_kernel import MapReduceKernel, slices
from dlvm_eq.ir import interpret
from dlvm_eq.pipeline import compile, plan_function

RNG = np.random.default_rng(36)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _close(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w, np.float64)
        assert np.shape(g) == w.shape
        scale = max(1.0, float(np.abs(w).max(initial=0.0)))
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=1e-5, atol=1e-5 * scale)


def _module(fn, *args):
    m = dq.make_ir(fn)(*args)
    return m, next(iter(m.functions))


def _plan_and_check(fn, *args, target="cpu"):
    m, name = _module(fn, *args)
    plan = plan_function(m[name], m, target=target)
    if target == "cpu":
        _close(compile(m, name, optimize=False)(*args), interpret(m, name, *args, float64=True))
    return plan


def _passes(plan) -> list[MapReduceStep]:
    return [s for s in plan.steps if isinstance(s, MapReduceStep)]


# ---------------------------------------------------------------- the kernel


def _relu_bias_spec(shape, axes):
    g, x = Load(0), Load(1)
    dz = Select(binary("greaterThan", x, 0.0), g, Const(0.0))
    reds = [(dz, "add", axes), (dz * dz, "add", axes), (unary("exp", x), "max", axes)]
    reds.append((x, "add", tuple(range(len(shape)))))  # and everything, in the same pass
    return MapReduceSpec("relu_bias", shape, [KernelInput("f32")] * 2, [dz], reds)


@pytest.mark.parametrize(
    "shape, axes",
    [
        ((4, 3, 5, 5), (0, 2, 3)),  # a bias gradient: leading and trailing axes
        ((37, 17), (0,)),  # a leading axis: the inner loop walks the outputs
        ((6, 29), (1,)),  # a trailing axis: an accumulator in a register
        ((2, 3, 4), ()),  # no axis
        ((5, 7), (0, 1)),  # everything
        ((3, 0, 4), (1,)),  # an empty space: identities
    ],
)
def test_the_kernel_agrees_with_its_float64_oracle(shape, axes):
    spec = _relu_bias_spec(shape, axes)
    a = [RNG.standard_normal(shape).astype(np.float32) for _ in range(2)]
    _close(MapReduceKernel(spec)(*a), tuple(evaluate_map_reduce(spec, a, "f64")))


def test_leading_axis_sums_are_bit_identical_with_any_thread_count():
    shape = (64, 16, 24, 24)  # 590K elements: several slices
    spec = _relu_bias_spec(shape, (0, 2, 3))
    assert slices(spec) > 1
    a = [RNG.standard_normal(shape).astype(np.float32) for _ in range(2)]
    first = MapReduceKernel(spec, threads=1)(*a)
    _close(first, tuple(evaluate_map_reduce(spec, a, "f64")))
    for threads in (2, 3, 4):
        for _ in range(2):
            again = MapReduceKernel(spec, threads=threads)(*a)
            assert all(np.array_equal(p, q) for p, q in zip(first, again)), threads


def test_a_spec_with_bad_axes_or_no_reduction_is_a_kernel_error():
    with pytest.raises(KernelError, match="axes"):
        MapReduceSpec("k", (2, 3), [KernelInput("f32")], [Load(0)], [(Load(0), "add", (2,))])
    with pytest.raises(KernelError, match="at least one reduction"):
        MapReduceSpec("k", (2, 3), [KernelInput("f32")], [Load(0)], [])


# ---------------------------------------------------------------- where it fires


def test_a_conv_bias_gradient_shares_the_pass_of_its_relu_adjoint():
    x = RNG.standard_normal((4, 3, 8, 8)).astype(np.float32)
    w = (RNG.standard_normal((6, 3, 3, 3)) * 0.3).astype(np.float32)
    b = (RNG.standard_normal((6,)) * 0.1).astype(np.float32)

    def loss(w, b, x):
        h = dq.relu(dq.conv2d(x, w, padding=1) + dq.reshape(b, (1, -1, 1, 1)))
        return dq.sum(h * h)

    m, name = _module(dq.value_and_grad(loss, argnums=(0, 1)), w, b, x)
    plan = plan_function(m[name], m)
    (p,) = _passes(plan)  # the bias gradient and the loss's sum, with the ReLU adjoint
    assert p.outputs and sorted(axes for _, _, axes in p.spec.reductions) == [
        (0, 1, 2, 3),
        (0, 2, 3),
    ]
    assert "in one pass with their maps" in str(plan.fusion) and plan.fusion.shared_saving > 0
    got = compile(m, name, optimize=False)(w, b, x)
    _close(got, interpret(m, name, w, b, x, float64=True))


def test_batch_norm_moments_over_n_h_w_are_one_pass():
    x = RNG.standard_normal((4, 5, 6, 6)).astype(np.float32)
    plan = _plan_and_check(lambda x: (dq.sum(x, axis=(0, 2, 3)), dq.sum(x * x, axis=(0, 2, 3))), x)
    (p,) = _passes(plan)
    assert len(plan.kernels) == 1 and not p.outputs and len(p.reductions) == 2


def test_layer_norm_moments_over_a_leading_axis_are_one_pass():
    x = RNG.standard_normal((32, 24)).astype(np.float32)

    def f(x):
        mean = dq.mean(x, axis=0)
        return mean, dq.mean(x * x, axis=0) - mean * mean

    (p,) = _passes(_plan_and_check(f, x))
    assert [axes for _, _, axes in p.spec.reductions] == [(0,), (0,)]


def test_softmax_along_a_leading_axis_sums_in_the_pass_of_its_exp():
    x = RNG.standard_normal((40, 12)).astype(np.float32)
    plan = _plan_and_check(lambda x: dq.softmax(x, axis=0), x)
    (p,) = _passes(plan)
    assert [op for _, op, _ in p.spec.reductions] == ["add"] and p.outputs


# ---------------------------------------------------------------- where it must not


def test_a_reduction_the_map_reads_keeps_its_own_pass():
    x = RNG.standard_normal((16, 8)).astype(np.float32)
    plan = _plan_and_check(lambda x: dq.exp(x - dq.max(x, axis=0)), x)
    assert not _passes(plan)


def test_reductions_over_different_axes_share_one_pass_with_their_map():
    x = RNG.standard_normal((6, 5, 4)).astype(np.float32)

    def f(x):
        e = dq.exp(x)
        return e, dq.sum(e, axis=0), dq.sum(e, axis=1), dq.max(e, axis=(0, 2))

    plan = _plan_and_check(f, x)
    (p,) = _passes(plan)  # e read once, written once; each reduction along its own axes
    assert len(plan.kernels) == 1 and p.outputs
    assert [(op, axes) for _, op, axes in p.spec.reductions] == [
        ("add", (0,)),
        ("add", (1,)),
        ("max", (0, 2)),
    ]


def test_a_map_output_read_at_another_order_is_not_folded_from_registers():
    x = RNG.standard_normal((9, 9)).astype(np.float32)

    def f(x):
        y = dq.tanh(dq.exp(dq.sin(x)) * 0.5)
        return y, dq.sum(dq.transpose(y), axis=0)

    plan = _plan_and_check(f, x)
    assert not _passes(plan)  # the sum reads the stored y transposed: in a pass of its own
    (alone,) = [k for k in plan.kernels if isinstance(k.spec, ReduceSpec)]
    assert alone.inputs == (plan.results[0].slot,) and alone.spec.inputs[0].strides == (1, 9)
    assert not plan.fusion.shared  # the report counts the passes the plan holds


def test_not_on_the_gpu_nor_when_switched_off(monkeypatch):
    x = RNG.standard_normal((4, 5, 6, 6)).astype(np.float32)
    f = lambda x: (dq.sum(x, axis=(0, 2, 3)), dq.sum(x * x, axis=(0, 2, 3)))
    assert not _passes(_plan_and_check(f, x, target="gpu"))
    monkeypatch.setenv("DLVM_EQ_MULTI_OUTPUT", "0")
    config.reload()  # (conftest re-reads the restored environment after the test)
    plan = _plan_and_check(f, x)
    assert not _passes(plan) and len(plan.kernels) == 2 and not plan.fusion.shared


# ---------------------------------------------------------------- random programs

_MAPS = [
    lambda a, b: a * b + 0.5,
    lambda a, b: dq.where(a > 0.0, b, 0.0),
    lambda a, b: dq.exp(a * 0.3) - b,
    lambda a, b: dq.tanh(a + b),
]
_REDUCE = [dq.sum, dq.max, dq.mean]


@st.composite
def _programs(draw):
    rank = draw(st.integers(2, 4))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["map", "reduce", "reduce", "center"]))
        axes = tuple(sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1))))
        steps.append((kind, draw(st.integers(0, 3)), draw(st.integers(0, 2)), axes))
    return shape, steps


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_programs())
def test_random_maps_and_reductions_agree_with_the_interpreter(program):
    shape, steps = program

    def f(x, y):
        values, outs = [x, y], []
        for kind, i, j, axes in steps:
            a, b = values[-1], values[-2 - (i % (len(values) - 1))]
            if kind == "map":
                values.append(_MAPS[i](a, b))
            elif kind == "reduce":
                outs.append(_REDUCE[j](a, axis=axes))
            else:  # a reduction read back by a map: it must not share that map's pass
                values.append(a - _REDUCE[j](b, axis=axes, keepdims=True))
        return tuple(outs) + (values[-1],)

    x, y = (RNG.standard_normal(shape).astype(np.float32) for _ in range(2))
    _plan_and_check(f, x, y)


def test_a_plan_with_a_shared_pass_round_trips_through_the_plan_cache_records():
    x = RNG.standard_normal((4, 5, 6, 6)).astype(np.float32)
    m, name = _module(lambda x: (dq.exp(x), dq.sum(dq.exp(x), axis=(0, 2, 3))), x)
    plan = plan_function(m[name], m)
    (p,) = _passes(plan)
    again = plan_schema().loads(plan_schema().dumps(plan))
    (q,) = _passes(again)
    assert q.spec == p.spec and (q.inputs, q.outputs, q.reductions) == (
        p.inputs,
        p.outputs,
        p.reductions,
    )
    assert str(again) == str(plan)


def test_layer_norm_gain_and_bias_gradients_share_a_pass_beside_the_row_kernels():
    x = RNG.standard_normal((6, 8, 16)).astype(np.float32)
    g = (1.0 + 0.1 * RNG.standard_normal((16,))).astype(np.float32)
    b = (0.1 * RNG.standard_normal((16,))).astype(np.float32)

    def loss(g, b, x):
        mu = dq.mean(x, axis=-1, keepdims=True)
        var = dq.mean((x - mu) ** 2, axis=-1, keepdims=True)
        h = (x - mu) / dq.sqrt(var + 1e-5) * g + b
        return dq.sum(dq.tanh(h))

    m, name = _module(dq.value_and_grad(loss, argnums=(0, 1)), g, b, x)
    plan = plan_function(m[name], m)
    (p,) = _passes(plan)  # d gain, d bias (and the loss's sum): one pass over (6, 8, 16)
    assert sorted(axes for _, _, axes in p.spec.reductions) == [(0, 1), (0, 1), (0, 1, 2)]
    _close(compile(m, name, optimize=False)(g, b, x), interpret(m, name, g, b, x, float64=True))
