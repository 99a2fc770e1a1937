"""Batched matmul end to end: `a @ b` / `dq.matmul` with numpy's rules for any ranks >= 1
(broadcast batch dimensions included) against a float64 reference written with per-matrix
np.dot, in the interpreter and compiled; the IR op `batchMatmul` (syntax, round trip, located
errors); gradients against central differences; the CPU plan (one BLAS call, transposed and
broadcast operands read as views); the emulated GPU."""

from __future__ import annotations

import fake_cupy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.codegen.planning.plan import BlasStep, ConcatStep, CopyStep
from dlvm_eq.errors import IRError, SourceError
from dlvm_eq.ir import interpret
from dlvm_eq.ir.parser import parse
from dlvm_eq.pipeline import check_grads, compile, plan_function

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def reference_matmul(a, b):
    """numpy's matmul rules spelled out: vectors promoted and dropped, batch dims broadcast,
    one float64 np.dot per batch index."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    va, vb = a.ndim == 1, b.ndim == 1
    a2 = a[None, :] if va else a
    b2 = b[:, None] if vb else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    a3 = np.broadcast_to(a2, batch + a2.shape[-2:])
    b3 = np.broadcast_to(b2, batch + b2.shape[-2:])
    out = np.empty(batch + (a2.shape[-2], b2.shape[-1]))
    for idx in np.ndindex(*batch):
        out[idx] = np.dot(a3[idx], b3[idx])
    if va:
        out = out[..., 0, :]
    if vb:
        out = out[..., 0]
    return out


@st.composite
def operand_shapes(draw):
    """Shapes of a and b: ranks 1 to 5, batch dims dropped or 1 on either side, odd sizes."""
    batch = draw(st.lists(st.integers(1, 3), max_size=3))
    m, k, n = (draw(st.integers(1, 5)) for _ in range(3))

    def side(last):
        if draw(st.integers(0, 4)) == 0:
            return (k,)  # a vector
        kept = batch[len(batch) - draw(st.integers(0, len(batch))) :]
        return tuple(1 if draw(st.booleans()) else d for d in kept) + last

    return side((m, k)), side((k, n))


# ---------------------------------------------------------------- against the reference


@settings(max_examples=30, **SETTINGS)
@given(operand_shapes(), st.integers(0, 2**16))
def test_matmul_matches_numpy_rules_in_the_interpreter_and_eagerly(shapes, seed):
    sa, sb = shapes
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    want = reference_matmul(a, b)
    got = dq.jit(lambda a, b: a @ b, target="interp")(a, b)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dq.matmul(a, b), want, rtol=1e-12, atol=1e-12)  # eager


@settings(max_examples=20, **SETTINGS)
@given(operand_shapes(), st.integers(0, 2**16))
def test_compiled_matmul_matches_numpy_rules(shapes, seed):
    sa, sb = shapes
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    got = dq.jit(lambda a, b: dq.tanh(a @ b))(a, b)
    np.testing.assert_allclose(got, np.tanh(reference_matmul(a, b)), rtol=1e-5, atol=1e-5)


def test_batches_of_any_rank_stay_one_batched_product_with_gradients():
    """No rank ceiling: the adjoint rules swap the last two axes of any rank (vec-range)."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 1, 2, 1, 2, 3, 4)), rng.standard_normal((2, 1, 3, 1, 4, 2))
    text = str(dq.make_ir(lambda a, b: a @ b)(a, b))
    assert "batchMatmul %" in text and "<2 x 2 x 2 x 3 x 2 x 3 x 4 x f64>" in text
    np.testing.assert_allclose(dq.jit(lambda a, b: a @ b)(a, b), reference_matmul(a, b), rtol=1e-12)
    check_grads(lambda a, b: dq.sum(dq.tanh(a @ b)), (a, b))


def test_unbatched_right_operand_is_one_gemm_over_all_rows_through_our_gemm():
    """(8, 32, 64) @ (64, 64): a shape cast and one `dot` big enough for our GEMM (forced on in
    the test session), not a batched product."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((8, 32, 64)).astype(np.float32)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    module = dq.make_ir(lambda a, w: a @ w)(a, w)
    assert "batchMatmul" not in str(module) and "dot %" in str(module)
    got = dq.jit(lambda a, w: a @ w)(a, w)
    np.testing.assert_allclose(got, reference_matmul(a, w), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- the CPU plan


def _plan(f, *args):
    module = dq.make_ir(f)(*args)
    return plan_function(module[next(iter(module.functions))], module)


def test_transposed_and_broadcast_operands_are_views_of_one_blas_call_each():
    a = np.zeros((2, 3, 4), np.float32)
    b = np.zeros((2, 5, 4), np.float32)
    c = np.zeros((1, 5, 6), np.float32)
    plan = _plan(lambda a, b, c: dq.relu(a @ dq.transpose(b, (0, 2, 1))) @ c, a, b, c)
    blas = [s for s in plan.steps if isinstance(s, BlasStep)]
    assert len(blas) == 2
    assert [op for op, _ in blas[0].b.chain] == ["transpose"]  # b read transposed, in place
    assert [op for op, _ in blas[1].b.chain] == ["broadcast"]  # c read with batch stride 0
    assert not [s for s in plan.steps if isinstance(s, (CopyStep, ConcatStep))]


def test_transposed_operands_compute_what_numpy_does():
    rng = np.random.default_rng(5)
    q, k = (
        rng.standard_normal((2, 3, 7, 4)).astype(np.float32),
        rng.standard_normal((2, 3, 6, 4)).astype(np.float32),
    )
    f = dq.jit(
        lambda q, k: (
            dq.transpose(q, (0, 1, 3, 2))
            @ dq.transpose(k @ dq.transpose(q, (0, 1, 3, 2)), (0, 1, 3, 2))
        )
    )
    qt = np.swapaxes(q.astype(np.float64), -1, -2)
    want = reference_matmul(qt, np.swapaxes(reference_matmul(k, qt), -1, -2))
    np.testing.assert_allclose(f(q, k), want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- gradients

GRAD_CASES = [
    ((2, 3, 4), (2, 4, 5)),
    ((2, 3, 4), (4, 5)),
    ((4,), (2, 4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((1, 2, 3), (4, 1, 3, 2)),
    ((2, 1, 2, 1, 2, 3), (2, 2, 1, 3, 2)),
]


@pytest.mark.parametrize("sa, sb", GRAD_CASES)
def test_gradients_match_central_differences(sa, sb):
    rng = np.random.default_rng(len(sa) * 10 + len(sb))
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    checks = check_grads(lambda a, b: dq.sum(dq.tanh(a @ b)), (a, b), order=2, rtol=1e-4, atol=1e-6)
    assert [c.order for c in checks] == [1, 2] and all(abs(c.analytic) > 1e-3 for c in checks)


def test_gradient_through_transposed_operands_matches_central_differences():
    rng = np.random.default_rng(6)
    q, k = rng.standard_normal((2, 2, 3, 4)), rng.standard_normal((2, 2, 5, 4))
    scores = lambda q, k: dq.sum(dq.softmax(q @ dq.transpose(k, (0, 1, 3, 2))) * q[..., :1])
    checks = check_grads(scores, (q, k), order=1, rtol=1e-4, atol=1e-6)
    assert abs(checks[0].analytic) > 1e-3


def _attention_grad():
    def loss(q, k, v):
        att = dq.softmax(q @ dq.transpose(k, (0, 2, 1)) * 0.5)
        return dq.sum((att @ v) ** 2)

    return dq.value_and_grad(loss, argnums=(0, 1, 2))


def _attention_inputs():
    rng = np.random.default_rng(7)
    return [rng.standard_normal(s).astype(np.float32) for s in ((3, 5, 4), (3, 6, 4), (3, 6, 2))]


def test_compiled_gradient_matches_the_interpreter():
    args = _attention_inputs()
    v_cpu, g_cpu = dq.jit(_attention_grad())(*args)
    v_ref, g_ref = dq.jit(_attention_grad(), target="interp")(*[a.astype(np.float64) for a in args])
    np.testing.assert_allclose(v_cpu, v_ref, rtol=1e-4)
    for g, r in zip(g_cpu, g_ref):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_gradient_on_the_emulated_gpu_matches_the_cpu(monkeypatch):
    args = _attention_inputs()
    module = _attention_grad().lower(*args)
    name = next(iter(module.functions))
    cpu = compile(module, name, target="cpu")(*args)
    with fake_cupy.installed(monkeypatch, sms=2) as cp:
        gpu = compile(module, name, target="gpu")(*[cp.asarray(a) for a in args])
    assert len(gpu) == len(cpu) == 4  # the value, then one gradient per argument
    for g, c in zip(gpu, cpu):
        assert isinstance(g, fake_cupy.DeviceArray)
        np.testing.assert_allclose(g.get(), c, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- IR syntax and errors

SRC = """module "m"
stage raw

func @f: (<2 x 3 x 4 x f32>, <2 x 4 x 5 x f32>) -> <2 x 3 x 5 x f32> {
'entry(%a: <2 x 3 x 4 x f32>, %b: <2 x 4 x 5 x f32>):
    %y = batchMatmul %a: <2 x 3 x 4 x f32>, %b: <2 x 4 x 5 x f32>
    return %y: <2 x 3 x 5 x f32>
}
"""


def test_ir_round_trips_and_means_one_product_per_batch_index():
    m = parse(SRC)
    assert str(m).strip() == SRC.strip()
    assert str(parse(str(m))) == str(m)
    rng = np.random.default_rng(8)
    a, b = (
        rng.standard_normal((2, 3, 4)).astype(np.float32),
        rng.standard_normal((2, 4, 5)).astype(np.float32),
    )
    np.testing.assert_allclose(interpret(m, "f", a, b), reference_matmul(a, b), rtol=1e-5)


@pytest.mark.parametrize(
    "b_type, words",
    [
        ("<3 x 4 x 5 x f32>", "batch dimensions differ"),
        ("<2 x 3 x 5 x f32>", "contracted dimensions differ"),
        ("<4 x 5 x f32>", "expected operands of one rank, 3 or more"),
        ("<2 x 4 x 5 x f64>", "different data types"),
    ],
)
def test_bad_operands_are_located_parse_errors(b_type, words):
    text = SRC.replace("<2 x 4 x 5 x f32>", b_type)  # in the signature too
    with pytest.raises(SourceError) as info:
        parse(text, "m.dl")
    e = info.value
    assert (e.filename, e.line) == ("m.dl", 6) and words in e.message


def test_op_table_accepts_every_rank_from_three():
    from dlvm_eq.ir import F32, tensor
    from dlvm_eq.ir.ops import OPS

    t = tensor(1, 1, 1, 2, 2, F32)
    assert OPS["batchMatmul"].result_type([t, t], {}) == t
    with pytest.raises(IRError, match="3 or more"):
        OPS["batchMatmul"].result_type([tensor(2, 2, F32)] * 2, {})


@pytest.mark.parametrize(
    "sa, sb, words",
    [
        ((2, 3, 4), (2, 5, 6), "contracted dimensions differ (4 vs 5)"),
        ((2, 3, 4), (3, 4, 6), "batch dimensions (2,) and (3,) do not broadcast"),
        ((), (3, 4), "at least one dimension"),
    ],
)
def test_dsl_shape_errors_point_at_the_users_line(sa, sb, words):
    a, b = np.zeros(sa, np.float32), np.zeros(sb, np.float32)
    with pytest.raises(dq.ShapeError) as info:
        dq.make_ir(lambda a, b: a @ b)(a, b)  # <- the user's line
    assert words in str(info.value)
    assert f"{__file__}:" in str(info.value)


def test_outer_products_run_as_a_broadcasting_multiply_and_agree(monkeypatch):
    """A product whose shared dimension is 1 (the weight gradient of a matrix-vector product, a
    rank-1 update) runs as a broadcasting multiply, exact since nothing is summed; transposed
    operands and batches included. numpy's matmul into an output buffer (the executor's call)
    is made to fail: the programs must not call it."""
    from dlvm_eq.codegen.runtime.gemm_runtime import is_outer_product

    matmul = np.matmul

    def no_matmul_into_a_buffer(*args, **kwargs):
        assert "out" not in kwargs, "an outer product ran through np.matmul"
        return matmul(*args, **kwargs)

    monkeypatch.setattr(np, "matmul", no_matmul_into_a_buffer)
    rng = np.random.default_rng(3)
    cases = [
        (lambda u, v: u @ v, (rng.standard_normal((64, 1)), rng.standard_normal((1, 48)))),
        (lambda u, v: u @ v.T, (rng.standard_normal((64, 1)), rng.standard_normal((48, 1)))),
        (lambda u, v: u.T @ v, (rng.standard_normal((1, 64)), rng.standard_normal((1, 48)))),
        (lambda u, v: u @ v, (rng.standard_normal((3, 16, 1)), rng.standard_normal((3, 1, 8)))),
        (lambda u, v: u @ v, (rng.standard_normal((16, 1)), rng.standard_normal((2, 1, 8)))),
    ]
    for f, args in cases:
        args = tuple(a.astype(np.float32) for a in args)
        jf = dq.jit(f)
        got = jf(*args)
        want = f(*(a.astype(np.float64) for a in args))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        blas = [s for s in jf.report(*args).plan.steps if isinstance(s, BlasStep)]
        assert all(is_outer_product(s.a.shape, s.b.shape) for s in blas)
        # a batched outer product is a broadcast multiply in the e-graph already
        # (rules/layout.egg, bmm-outer): no product step is left to run
        assert blas or max(a.ndim for a in args) == 3
