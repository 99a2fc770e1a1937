"""The reference interpreter against numpy written out directly, for every op in the op table
(a new op without a case here fails test_every_op_has_a_case), with broadcasting corner cases
and reductions over several axes with each combinator and init."""

import itertools
import math

import numpy as np
import pytest
from control_flow_programs import check_interp_op
from interp_references import (
    POSITIVE_DOMAIN,
    REF_BINARY,
    REF_COMPARE,
    REF_LOGIC,
    REF_UNARY,
    SHAPE_PAIRS,
    close,
    run,
    sample,
)
from window_cases import check_window_op

from dlvm_eq.errors import DlvmError
from dlvm_eq.ir import (
    BOOL,
    F32,
    F64,
    I32,
    OPS,
    Const,
    FunctionBuilder,
    Module,
    TensorType,
    TupleType,
    interpret,
)
from dlvm_eq.ir.control_flow import CONTROL_FLOW_OPS
from dlvm_eq.ir.ops import BINARY, BIT_OPS, COMPARE, LOGIC, REDUCE_COMBINATORS, UNARY
from dlvm_eq.ir.window_ops import WINDOW_OPS

# ---------------------------------------------------------------- elementwise


def check_unary(op):
    spec = OPS[op]
    for dtype in (F32, F64) + (() if spec.float_only else (I32,)):
        for shape in [(), (5,), (2, 3)]:
            x = sample(shape, dtype, positive=op in POSITIVE_DOMAIN)
            got = run(op, [TensorType(shape, dtype)], [x])
            assert got.dtype == dtype.numpy
            close(got, REF_UNARY[op](x.astype(np.float64) if dtype.is_float else x), dtype)
    # float64=True computes a float32 program in float64
    x = sample((4,), F32, positive=op in POSITIVE_DOMAIN)
    got = run(op, [TensorType((4,), F32)], [x], float64=True)
    assert got.dtype == np.float64
    close(got, REF_UNARY[op](x.astype(np.float64)), F64)


def check_binary(op):
    spec = OPS[op]
    for dtype in (F32, F64) + (() if spec.float_only else (I32,)):
        for sa, sb in SHAPE_PAIRS:
            a = sample(sa, dtype, positive=op == "power")
            b = sample(sb, dtype)
            if op == "divide" and dtype.is_float:
                b = np.where(b == 0, 1, b).astype(b.dtype)
            got = run(op, [TensorType(sa, dtype), TensorType(sb, dtype)], [a, b])
            assert got.dtype == dtype.numpy and got.shape == np.broadcast_shapes(sa, sb)
            ref_args = (a.astype(np.float64), b.astype(np.float64)) if dtype.is_float else (a, b)
            close(got, REF_BINARY[op](*ref_args), dtype)
    # a scalar literal operand on either side
    x = sample((2, 3), F32, positive=True)
    for operands, want in [
        (("x", 2.0), REF_BINARY[op](x.astype(np.float64), 2.0)),
        ((0.5, "x"), REF_BINARY[op](0.5, x.astype(np.float64))),
    ]:
        b = FunctionBuilder("f", [TensorType((2, 3), F32)])
        ops = [b.params[0] if o == "x" else Const.of(o, F32) for o in operands]
        m = Module("t")
        m.add(b.finish(b.emit(op, ops)))
        close(interpret(m, "f", x), want, F32)


def check_bits(op):
    rng = np.random.default_rng(5)
    for sa, sb in SHAPE_PAIRS:
        a = rng.integers(-(2**31), 2**31, size=sa, dtype=np.int64).astype(np.int32)
        b = rng.integers(0, 40, size=sb).astype(np.int32)
        got = run(op, [TensorType(sa, I32), TensorType(sb, I32)], [a, b])
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, REF_BINARY[op](a, b))


def check_compare(op):
    for dtype in (F32, I32):
        for sa, sb in SHAPE_PAIRS:
            a, b = sample(sa, dtype), sample(sb, dtype)
            if dtype is I32:  # few distinct values, so that equal elements occur
                a, b = (a % 3).astype(np.int32), (b % 3).astype(np.int32)
            got = run(op, [TensorType(sa, dtype), TensorType(sb, dtype)], [a, b])
            assert got.dtype == np.bool_
            close(got, REF_COMPARE[op](a, b), BOOL)
    # equal values compare equal: the "OrEqual" variants differ from the strict ones here
    a = np.array([1.0, 2.0, 3.0], np.float32)
    close(run(op, [TensorType((3,), F32)] * 2, [a, a]), REF_COMPARE[op](a, a), BOOL)


def check_logic(op):
    if OPS[op].arity == 1:
        for shape in [(), (4,), (2, 3)]:
            x = sample(shape, BOOL)
            close(run(op, [TensorType(shape, BOOL)], [x]), REF_LOGIC[op](x), BOOL)
        return
    for sa, sb in SHAPE_PAIRS:
        a, b = sample(sa, BOOL), sample(sb, BOOL)
        close(
            run(op, [TensorType(sa, BOOL), TensorType(sb, BOOL)], [a, b]), REF_LOGIC[op](a, b), BOOL
        )


# ---------------------------------------------------------------- the other ops


def check_select(op):
    for sa, sb, sm in [
        ((2, 3), (2, 3), (2, 3)),
        ((2, 3), (), (2, 1)),
        ((), (3,), (2, 3)),
        ((4,), (1,), ()),
    ]:
        a, b, m = sample(sa, F32), sample(sb, F32), sample(sm, BOOL)
        got = run(op, [TensorType(sa, F32), TensorType(sb, F32), TensorType(sm, BOOL)], [a, b, m])
        shape = np.broadcast_shapes(sa, sb, sm)
        want = np.array(
            [
                x if c else y
                for x, y, c in zip(*(np.broadcast_to(v, shape).ravel() for v in (a, b, m)))
            ],
            np.float32,
        ).reshape(shape)
        close(got, want, F32)


def _reduce_ref(x, comb, init, axes):
    """Fold the reduced axes with a Python loop, starting from init."""
    fn = {
        "add": lambda s, v: s + v,
        "multiply": lambda s, v: s * v,
        "max": lambda s, v: v if v > s else s,
        "min": lambda s, v: v if v < s else s,
    }[comb]
    keep = [i for i in range(x.ndim) if i not in axes]
    out = np.empty(
        [x.shape[i] for i in keep], dtype=np.float64 if x.dtype.kind == "f" else np.int64
    )
    for kept in itertools.product(*(range(x.shape[i]) for i in keep)):
        acc = init
        for red in itertools.product(*(range(x.shape[i]) for i in axes)):
            idx = [0] * x.ndim
            for i, v in zip(keep, kept):
                idx[i] = v
            for i, v in zip(axes, red):
                idx[i] = v
            acc = fn(acc, x[tuple(idx)].item())
        out[kept] = acc
    return out


def check_reduce(op):
    x = sample((2, 3, 4), F64)
    all_axes = [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (2, 0), (0, 1, 2)]
    for comb in REDUCE_COMBINATORS:
        identity = {"add": 0.0, "multiply": 1.0, "max": -math.inf, "min": math.inf}[comb]
        for init in (identity, 0.25, -1.5):
            for axes in all_axes:
                got = run(
                    op, [TensorType(x.shape, F64)], [x], combinator=comb, init=init, axes=axes
                )
                close(got, _reduce_ref(x, comb, init, sorted(axes)), F64)
        # no axes: the init is combined with every element
        got = run(op, [TensorType(x.shape, F64)], [x], combinator=comb, init=0.25, axes=())
        close(got, _reduce_ref(x, comb, 0.25, []), F64)
    for comb in REDUCE_COMBINATORS:  # in f32 and i32 too
        xf = sample((3, 5), F32)
        close(
            run(op, [TensorType((3, 5), F32)], [xf], combinator=comb, init=1.0, axes=(1,)),
            _reduce_ref(xf.astype(np.float64), comb, 1.0, [1]),
            F32,
        )
        xi = sample((3, 4), I32)
        close(
            run(op, [TensorType((3, 4), I32)], [xi], combinator=comb, init=2, axes=(0, 1)),
            _reduce_ref(xi, comb, 2, [0, 1]),
            I32,
        )


def check_dot(op):
    for sa, sb in [
        ((3, 4), (4, 5)),
        ((4,), (4, 5)),
        ((3, 4), (4,)),
        ((4,), (4,)),
        ((1, 1), (1, 1)),
    ]:
        a, b = sample(sa, F64), sample(sb, F64)
        a2, b2 = a.reshape(-1, sa[-1]), b.reshape(sb[0], -1)
        want = np.array(
            [
                [sum(a2[i, k] * b2[k, j] for k in range(sa[-1])) for j in range(b2.shape[1])]
                for i in range(a2.shape[0])
            ]
        ).reshape(sa[:-1] + sb[1:])
        close(run(op, [TensorType(sa, F64), TensorType(sb, F64)], [a, b]), want, F64)
    a, b = sample((2, 3), I32), sample((3, 2), I32)
    close(
        run(op, [TensorType((2, 3), I32), TensorType((3, 2), I32)], [a, b]),
        np.einsum("ij,jk->ik", a.astype(np.int64), b.astype(np.int64)),
        I32,
    )


def check_transpose(op):
    x = sample((2, 3, 4), F32)
    close(
        run(op, [TensorType(x.shape, F32)], [x]),
        np.array([[[x[i, j, k] for i in range(2)] for j in range(3)] for k in range(4)]),
        F32,
    )
    for perm in [(1, 0, 2), (2, 0, 1), (0, 1, 2)]:
        got = run(op, [TensorType(x.shape, F32)], [x], perm=perm)
        assert got.shape == tuple(x.shape[p] for p in perm)
        for idx in itertools.product(*(range(d) for d in got.shape)):
            src = [0, 0, 0]
            for out_axis, p in enumerate(perm):
                src[p] = idx[out_axis]
            assert got[idx] == x[tuple(src)]
    m = sample((3, 2), F32)
    close(run(op, [TensorType((3, 2), F32)], [m]), m.T, F32)
    v = sample((5,), F32)
    close(run(op, [TensorType((5,), F32)], [v]), v, F32)


def check_shapeCast(op):
    x = sample((2, 3, 4), F32)
    for shape in [(6, 4), (24,), (4, 3, 2), (1, 24, 1)]:
        got = run(op, [TensorType(x.shape, F32)], [x], shape=shape)
        assert got.shape == shape
        close(got.ravel(), x.ravel(), F32)  # row-major order is kept
    s = np.array(2.5, np.float32)
    close(run(op, [TensorType((), F32)], [s], shape=(1, 1)), [[2.5]], F32)
    close(run(op, [TensorType((1,), F32)], [np.array([3.0], np.float32)], shape=()), 3.0, F32)


def check_padShape(op):
    x = sample((2, 3), F32)
    for at, shape in [(0, (1, 2, 3)), (1, (2, 1, 3)), (2, (2, 3, 1))]:
        got = run(op, [TensorType(x.shape, F32)], [x], at=at)
        assert got.shape == shape
        close(got.ravel(), x.ravel(), F32)


def check_squeezeShape(op):
    x = sample((2, 1, 3, 1), F32)
    for at, shape in [(1, (2, 3, 1)), (3, (2, 1, 3))]:
        got = run(op, [TensorType(x.shape, F32)], [x], at=at)
        assert got.shape == shape
        close(got.ravel(), x.ravel(), F32)


def check_broadcast(op):
    for src, dst in [((3, 1), (2, 3, 4)), ((), (2, 2)), ((4,), (3, 4)), ((1, 1), (1, 5))]:
        x = sample(src, F32)
        got = run(op, [TensorType(src, F32)], [x], shape=dst)
        assert got.shape == dst
        close(got, x + np.zeros(dst, np.float32), F32)


def check_dataTypeCast(op):
    x = np.array([-2.7, -0.5, 0.0, 0.5, 1.9, 3.0], np.float32)
    close(run(op, [TensorType((6,), F32)], [x], dtype=I32), [-2, 0, 0, 0, 1, 3], I32)  # toward zero
    close(
        run(op, [TensorType((6,), F32)], [x], dtype=BOOL),
        [True, True, False, True, True, True],
        BOOL,
    )
    got = run(op, [TensorType((6,), F32)], [x], dtype=F64)
    assert got.dtype == np.float64
    close(got, [float(v) for v in x], F64)
    close(
        run(op, [TensorType((3,), I32)], [np.array([1, -2, 7], np.int32)], dtype=F32),
        [1.0, -2.0, 7.0],
        F32,
    )
    close(run(op, [TensorType((2,), BOOL)], [np.array([True, False])], dtype=F32), [1.0, 0.0], F32)


def check_concatenate(op):
    a, b, c = sample((2, 3), F32), sample((2, 1), F32), sample((2, 2), F32)
    got = run(
        op,
        [TensorType((2, 3), F32), TensorType((2, 1), F32), TensorType((2, 2), F32)],
        [a, b, c],
        axis=1,
    )
    close(got, [list(a[i]) + list(b[i]) + list(c[i]) for i in range(2)], F32)
    got = run(op, [TensorType((2, 3), F32)] * 2, [a, a], axis=0)
    close(got, list(a) + list(a), F32)


def check_slice(op):
    x = sample((2, 5, 3), F32)
    got = run(op, [TensorType((2, 5, 3), F32)], [x], axis=1, lo=1, hi=4)
    assert got.shape == (2, 3, 3)
    close(got, [[list(x[i, j]) for j in (1, 2, 3)] for i in range(2)], F32)  # x[:, 1:4] by hand
    got = run(op, [TensorType((2, 5, 3), F32)], [x], axis=2, lo=2, hi=3)
    close(got.ravel(), [x[i, j, 2] for i in range(2) for j in range(5)], F32)
    n = np.array([4, -1, 7], np.int32)
    close(run(op, [TensorType((3,), I32)], [n], axis=0, lo=0, hi=2), [4, -1], I32)


def _run_body(param_types, build, *arrays, float64=False):
    b = FunctionBuilder("f", param_types)
    m = Module("t")
    m.add(b.finish(build(b)))
    return interpret(m, "f", *arrays, float64=float64)


def check_literal(op):
    t = TensorType((2, 3), F32)
    close(_run_body([], lambda b: b.emit(op, [], value=1.5, type=t)), np.full((2, 3), 1.5), F32)
    arr = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    close(_run_body([], lambda b: b.emit(op, [], value=arr, type=t)), arr, F32)
    got = _run_body([], lambda b: b.emit(op, [], value=True, type=TensorType((2,), BOOL)))
    close(got, [True, True], BOOL)
    got = _run_body([], lambda b: b.emit(op, [], value=0.1, type=TensorType((), F32)), float64=True)
    assert got.dtype == np.float64


def check_tuple(op):
    x, y = sample((2,), F32), sample((), F32)
    got = _run_body(
        [TensorType((2,), F32), TensorType((), F32)],
        lambda b: b.emit(op, [b.params[1], b.params[0], b.params[1]]),
        x,
        y,
    )
    assert isinstance(got, tuple) and len(got) == 3
    close(got[0], y, F32)
    close(got[1], x, F32)


def check_extract(op):
    x, y = sample((2,), F32), sample((3,), F32)

    def build(b):
        t = b.emit("tuple", list(b.params))
        return b.emit(op, [t], index=1)

    close(_run_body([TensorType((2,), F32), TensorType((3,), F32)], build, x, y), y, F32)


def check_apply(op):
    g = FunctionBuilder("g", [TensorType((2,), F32), TensorType((2,), F32)])
    g_fn = g.finish(g.emit("subtract", list(g.params)))
    f = FunctionBuilder("f", [TensorType((2,), F32)])
    x = f.params[0]
    y = f.emit(op, [x, f.emit("square", [x])], callee="g", type=g_fn.result_type)
    m = Module("t")
    m.add(g_fn)
    m.add(f.finish(y))
    v = np.array([2.0, -3.0], np.float32)
    close(interpret(m, "f", v), v - v * v, F32)


def check_batchMatmul(op):
    a, b = sample((2, 3, 4), F32), sample((2, 4, 5), F32)
    t = [TensorType((2, 3, 4), F32), TensorType((2, 4, 5), F32)]
    want = np.stack([a[i].astype(np.float64) @ b[i] for i in range(2)])  # one product per batch
    close(_run_body(t, lambda bd: bd.emit(op, list(bd.params)), a, b), want, F32)


def check_take(op):
    x = sample((4, 3), F32)
    ids = np.array([2, 0, 2, 3], np.int32)
    t = [TensorType((4, 3), F32), TensorType((4,), I32)]
    got = _run_body(t, lambda b: b.emit(op, list(b.params), axis=0), x, ids)
    close(got, np.stack([x[i] for i in ids]), F32)
    x2 = sample((2, 5), F32)
    got = _run_body(
        [TensorType((2, 5), F32), TensorType((4,), I32)],
        lambda b: b.emit(op, list(b.params), axis=1),
        x2,
        ids,
    )
    close(got, np.stack([x2[:, i] for i in ids], axis=1), F32)


def check_scatterAdd(op):
    g = sample((4, 3), F32)
    ids = np.array([2, 0, 2, 3], np.int32)
    want = np.zeros((5, 3))
    for row, i in zip(g, ids):  # repeated indices accumulate
        want[i] += row
    t = [TensorType((4, 3), F32), TensorType((4,), I32)]
    close(_run_body(t, lambda b: b.emit(op, list(b.params), axis=0, size=5), g, ids), want, F32)


def check_sliceScatter(op):
    g = sample((2, 3), F32)
    want = np.zeros((2, 8))
    for j in range(3):  # g's columns at 1, 4, 7
        want[:, 1 + 3 * j] = g[:, j]
    got = _run_body(
        [TensorType((2, 3), F32)],
        lambda b: b.emit(op, list(b.params), axis=1, lo=1, step=3, size=8),
        g,
    )
    close(got, want, F32)


def check_cumsum(op):
    x = sample((3, 4), F32)
    t = [TensorType((3, 4), F32)]
    forward = np.array(
        [[x[i, : j + 1].astype(np.float64).sum() for j in range(4)] for i in range(3)]
    )
    backward = np.array([[x[i, j:].astype(np.float64).sum() for j in range(4)] for i in range(3)])
    close(
        _run_body(t, lambda b: b.emit(op, list(b.params), axis=1, reverse=False), x), forward, F32
    )
    close(
        _run_body(t, lambda b: b.emit(op, list(b.params), axis=1, reverse=True), x), backward, F32
    )


def check_window(op):
    rng = np.random.default_rng(len(op))
    for _ in range(8):
        check_window_op(op, rng)


def check_attention(op):  # issue 33: softmax(q kᵀ s + bias) v, against a per-row loop
    rng = np.random.default_rng(33)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 2)))
    pad = np.array([0, 0, 0, -np.inf, 0], np.float32).reshape(1, 1, 5)
    t = [TensorType(a.shape, F32) for a in (q, k, v, pad)]
    for causal in (0, 1):
        want = np.zeros((2, 3, 2))
        for i, j in np.ndindex(2, 3):
            s = q[i, j].astype(np.float64) @ k[i].T * 0.5 + pad[0, 0]
            s[np.arange(5) > j] = -np.inf if causal else s[np.arange(5) > j]
            p = np.exp(s - s.max())
            want[i, j] = p / p.sum() @ v[i]
        got = _run_body(
            t, lambda b: b.emit(op, list(b.params), scale=0.5, causal=causal), q, k, v, pad
        )
        close(got, want, F32)


def check_attention_backward(op):
    """dq, dk, dv of softmax(q kᵀ s + bias) v at the true output o, against the vector-Jacobian
    product written out in float64 (P, dP = g vᵀ, dS = P (dP - rowsum(dP P)))."""
    rng = np.random.default_rng(34)
    shapes = ((2, 3, 4), (2, 5, 4), (2, 5, 2))
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    g = rng.standard_normal((2, 3, 2)).astype(np.float32)
    pad = np.array([0, 0, 0, -np.inf, 0], np.float32).reshape(1, 1, 5)
    for causal in (0, 1):
        s = np.einsum("bid,bjd->bij", q.astype(np.float64), k) * 0.5 + pad
        if causal:
            s = np.where(np.arange(5)[None, :] > np.arange(3)[:, None], -np.inf, s)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = p @ v
        dp = g @ np.swapaxes(v, 1, 2)
        ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * 0.5
        wants = (ds @ k, np.swapaxes(ds, 1, 2) @ q, np.swapaxes(p, 1, 2) @ g)
        args = (q, k, v, pad, o.astype(np.float32), g)
        t = [TensorType(a.shape, F32) for a in args]
        for wrt, want in enumerate(wants):
            got = _run_body(
                t,
                lambda b: b.emit(op, list(b.params), scale=0.5, causal=causal, wrt=wrt),
                *args,
            )
            close(got, want, F32)


CHECKS = {
    "attention": check_attention,
    "attentionBackward": check_attention_backward,
    **{op: check_unary for op in REF_UNARY},
    **{op: check_binary for op in REF_BINARY},
    **{op: check_compare for op in REF_COMPARE},
    **{op: check_logic for op in REF_LOGIC},
    "select": check_select,
    "reduce": check_reduce,
    "dot": check_dot,
    "transpose": check_transpose,
    "shapeCast": check_shapeCast,
    "padShape": check_padShape,
    "squeezeShape": check_squeezeShape,
    "broadcast": check_broadcast,
    "dataTypeCast": check_dataTypeCast,
    "concatenate": check_concatenate,
    "slice": check_slice,
    "literal": check_literal,
    "tuple": check_tuple,
    "extract": check_extract,
    "apply": check_apply,
    **{op: check_window for op in WINDOW_OPS},
    "batchMatmul": check_batchMatmul,
    "take": check_take,
    "scatterAdd": check_scatterAdd,
    "sliceScatter": check_sliceScatter,
    "cumsum": check_cumsum,
    **{op: check_bits for op in BIT_OPS},
    **{op: check_interp_op for op in CONTROL_FLOW_OPS},  # tests/control_flow_programs.py
}


def test_every_op_has_a_case():
    missing = sorted(set(OPS) - set(CHECKS))
    assert not missing, f"ops without an interpreter test: {missing}"
    kinds = {UNARY: REF_UNARY, BINARY: REF_BINARY, COMPARE: REF_COMPARE, LOGIC: REF_LOGIC}
    for name, spec in OPS.items():
        if spec.kind in kinds:
            assert name in kinds[spec.kind], f"{name} ({spec.kind}) has no reference of its kind"


@pytest.mark.parametrize("op", sorted(OPS))
def test_op_against_numpy(op):
    if op not in CHECKS:
        pytest.fail(f"no interpreter test for op {op!r}")
    CHECKS[op](op)


# ---------------------------------------------------------------- interpreter behaviour


def test_float64_mode_is_more_accurate():
    x = np.full((1000,), 0.1, np.float32)
    b = FunctionBuilder("f", [TensorType((1000,), F32)])
    m = Module("t")
    m.add(b.finish(b.emit("reduce", [b.params[0]], combinator="add", init=0.0, axes=(0,))))
    exact = 1000 * float(np.float32(0.1))
    lo, hi = interpret(m, "f", x), interpret(m, "f", x, float64=True)
    assert hi.dtype == np.float64 and lo.dtype == np.float32
    assert abs(hi - exact) < 1e-9


def test_argument_errors_are_dlvm_errors():
    b = FunctionBuilder("f", [TensorType((2,), F32)])
    m = Module("t")
    m.add(b.finish(b.emit("exp", list(b.params))))
    with pytest.raises(DlvmError, match="argument 0 has shape"):
        interpret(m, "f", np.zeros(3))
    with pytest.raises(DlvmError, match="takes 1 arguments, got 2"):
        interpret(m, "f", np.zeros(2), np.zeros(2))
    with pytest.raises(DlvmError, match="no function @g"):
        interpret(m, "g")


def test_tuple_result_types():
    t = TupleType((TensorType((2,), F32), TensorType((), F32)))
    assert str(t) == "(<2 x f32>, f32)"
