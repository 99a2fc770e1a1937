"""The staged DSL: traced programs, run by the reference interpreter, agree with numpy."""

from __future__ import annotations

import os

import numpy as np
import pytest
from scipy import special

import dlvm_eq as dq
from dlvm_eq.ir import Module, verify

RNG = np.random.default_rng(0)
TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-12, atol=1e-13)}
THIS_FILE = os.path.basename(__file__)


def rand(*shape, dtype=np.float64, low=-2.0, high=2.0):
    return RNG.uniform(low, high, size=shape).astype(dtype)


def traced(fn, *args):
    """Trace `fn` on `args`, check the IR, run it with the reference interpreter."""
    module = dq.make_ir(fn)(*args)
    verify(module)
    (name,) = module.functions
    return dq.interpret(module, name, *args)


def line_of(marker: str) -> int:
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "line_of(" not in line:
                return i
    raise AssertionError(marker)


# ------------------------------------------------------------------ elementwise ops

LOW = {"log": 0.1, "sqrt": 0.1, "rsqrt": 0.1, "log1p": -0.9}
UNARY = {
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sigmoid": special.expit,
    "relu": lambda x: np.maximum(x, 0),
    "sqrt": np.sqrt,
    "abs": np.abs,
    "square": np.square,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "softplus": lambda x: np.logaddexp(0, x),
    "negative": np.negative,
    "sin": np.sin,
    "cos": np.cos,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tan": np.tan,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "sign": np.sign,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_numpy(name, dtype):
    x = rand(3, 4, dtype=dtype, low=LOW.get(name, -1.4), high=1.4)
    fn = getattr(dq, name)
    out = traced(lambda x: fn(x), x)
    assert out.dtype == dtype and out.shape == x.shape
    np.testing.assert_allclose(out, UNARY[name](x.astype(np.float64)), **TOL[dtype])
    np.testing.assert_allclose(fn(x), out, **TOL[dtype])  # eager on numpy: same semantics


BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "subtract": (lambda a, b: a - b, np.subtract),
    "multiply": (lambda a, b: a * b, np.multiply),
    "divide": (lambda a, b: a / b, np.divide),
    "power": (lambda a, b: a**b, np.power),
    "maximum": (dq.maximum, np.maximum),
    "minimum": (dq.minimum, np.minimum),
    "add (function)": (dq.add, np.add),
}
SHAPES = [
    ((3, 4), (3, 4)),
    ((3, 4), (4,)),
    ((3, 1), (1, 4)),
    ((2, 3, 4), (3, 1)),
    ((), (3,)),
    ((4,), ()),
    ((2, 1, 4), (3, 1)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcasting_matches_numpy(name, shapes, dtype):
    a, b = rand(*shapes[0], dtype=dtype, low=0.5), rand(*shapes[1], dtype=dtype, low=0.5)
    fn, ref = BINARY[name]
    out = traced(fn, a, b)
    expected = ref(a.astype(np.float64), b.astype(np.float64))
    assert out.shape == expected.shape and out.dtype == dtype
    np.testing.assert_allclose(out, expected, **TOL[dtype])


@pytest.mark.parametrize(
    "op,ref",
    [
        ("<", np.less),
        ("<=", np.less_equal),
        (">", np.greater),
        (">=", np.greater_equal),
        ("==", np.equal),
        ("!=", np.not_equal),
    ],
)
def test_comparisons_give_bool_tensors(op, ref):
    a = RNG.integers(0, 3, (3, 4)).astype(np.float32)
    b = RNG.integers(0, 3, (4,)).astype(np.float32)
    fn = eval(f"lambda a, b: a {op} b")
    module = dq.make_ir(fn)(a, b)
    assert "-> <3 x 4 x bool>" in str(module)
    out = dq.interpret(module, "lambda", a, b)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, ref(a, b))


def test_scalar_operands_are_weakly_typed():
    x = rand(3, dtype=np.float32)
    module = dq.make_ir(lambda x: 2 * x + np.float64(0.5) - 1.0 / x + 2**x)(x)
    text = str(module)
    assert "f64" not in text and "2.0: f32" in text and "0.5: f32" in text
    out = dq.interpret(module, "lambda", x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, 2 * x + 0.5 - 1 / x + 2**x, rtol=1e-5)
    # the same with f64 tensors stays f64
    x64 = x.astype(np.float64)
    assert traced(lambda x: 3.0 * x, x64).dtype == np.float64


def test_dtype_promotion():
    i = np.arange(6, dtype=np.int64).reshape(2, 3)  # int arrays trace as i32
    f = rand(2, 3, dtype=np.float32)
    d = rand(3)
    m = dq.make_ir(lambda i, f, d: (i / 2, i * 0.5, i + 1, f + d, i + f))(i, f, d)
    assert "(<2 x 3 x i32>, <2 x 3 x f32>, <3 x f64>)" in str(m)
    out = dq.interpret(m, "lambda", i, f, d)
    assert [o.dtype for o in out] == [np.float32, np.float32, np.int32, np.float64, np.float32]
    np.testing.assert_allclose(out[0], i / 2)
    np.testing.assert_array_equal(out[2], i + 1)
    np.testing.assert_allclose(out[3], f.astype(np.float64) + d, rtol=1e-12)
    np.testing.assert_allclose(out[4], i + f, rtol=1e-6)


def test_astype_and_bool_inputs():
    x = rand(4, dtype=np.float32)
    mask = np.array([True, False, True, False])
    out = traced(lambda x, m: (x.astype("f64") * 2, dq.where(m, x, -x), dq.sum(m)), x, mask)
    assert out[0].dtype == np.float64 and out[2].dtype == np.int32
    np.testing.assert_allclose(out[0], x.astype(np.float64) * 2)
    np.testing.assert_array_equal(out[1], np.where(mask, x, -x))
    assert out[2] == 2


# ------------------------------------------------------------------ reductions

AXES = [None, 0, 1, -1, (0, 2), (-1, 0), ()]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reductions_match_numpy(name, axis, keepdims, dtype):
    x = rand(2, 3, 4, dtype=dtype)
    out = traced(lambda x: getattr(dq, name)(x, axis=axis, keepdims=keepdims), x)
    expected = getattr(np, name)(x.astype(np.float64), axis=axis, keepdims=keepdims)
    assert np.shape(out) == expected.shape and out.dtype == dtype
    np.testing.assert_allclose(out, expected, **TOL[dtype])
    eager = getattr(dq, name)(x, axis=axis, keepdims=keepdims)
    np.testing.assert_allclose(eager, expected, **TOL[dtype])


def test_tensor_methods_and_integer_reductions():
    x = RNG.integers(-5, 5, (3, 4)).astype(np.int32)
    out = traced(lambda x: (x.sum(axis=0), x.max(), x.min(axis=1, keepdims=True), x.mean()), x)
    np.testing.assert_array_equal(out[0], x.sum(axis=0))
    assert out[1] == x.max() and out[0].dtype == np.int32
    np.testing.assert_array_equal(out[2], x.min(axis=1, keepdims=True))
    assert out[3].dtype == np.float32 and np.isclose(out[3], x.mean())


# ------------------------------------------------------------------ layout and linear algebra


@pytest.mark.parametrize(
    "sa,sb", [((3, 4), (4, 5)), ((3, 4), (4,)), ((4,), (4, 5)), ((4,), (4,))], ids=str
)
def test_matmul(sa, sb):
    a, b = rand(*sa), rand(*sb)
    np.testing.assert_allclose(traced(lambda a, b: a @ b, a, b), a @ b, rtol=1e-12)
    np.testing.assert_allclose(traced(dq.matmul, a, b), a @ b, rtol=1e-12)
    np.testing.assert_allclose(traced(lambda b: a @ b, b), a @ b, rtol=1e-12)  # ndarray @ Tensor


def test_transpose_reshape_concatenate():
    x = rand(2, 3, 4)
    out = traced(
        lambda x: (
            x.T,
            dq.transpose(x),
            dq.transpose(x, (1, -1, 0)),
            dq.reshape(x, (4, -1)),
            x.reshape(-1),
            dq.reshape(x, (2, 12)),
            dq.concatenate([x, 2 * x], axis=-1),
            dq.concatenate((x, x, x), axis=0),
        ),
        x,
    )
    expected = (
        x.T,
        np.transpose(x),
        np.transpose(x, (1, 2, 0)),
        x.reshape(4, -1),
        x.reshape(-1),
        x.reshape(2, 12),
        np.concatenate([x, 2 * x], -1),
        np.concatenate([x, x, x], 0),
    )
    for o, e in zip(out, expected):
        assert o.shape == e.shape
        np.testing.assert_array_equal(o, e)


def test_where_broadcasts_and_accepts_non_bool_conditions():
    c, a, b = rand(3, 1), rand(4), rand(3, 4)
    out = traced(
        lambda c, a, b: (
            dq.where(c > 0, a, b),
            dq.where(c > 0, a, 0.0),
            dq.where(dq.relu(c), 1.0, b),
        ),
        c,
        a,
        b,
    )
    np.testing.assert_array_equal(out[0], np.where(c > 0, a, b))
    np.testing.assert_array_equal(out[1], np.where(c > 0, a, 0.0))
    np.testing.assert_array_equal(out[2], np.where(np.maximum(c, 0) != 0, 1.0, b))


# ------------------------------------------------------------------ stable composites


@pytest.mark.parametrize("scale", [1.0, 1e4])
@pytest.mark.parametrize("axis", [-1, 0, (0, 1)], ids=str)
def test_softmax_family_is_stable(scale, axis):
    x = rand(3, 5) * scale
    out = traced(
        lambda x: (
            dq.softmax(x, axis),
            dq.log_softmax(x, axis),
            dq.logsumexp(x, axis),
            dq.logsumexp(x, axis, keepdims=True),
        ),
        x,
    )
    expected = (
        special.softmax(x, axis),
        special.log_softmax(x, axis),
        special.logsumexp(x, axis),
        special.logsumexp(x, axis, keepdims=True),
    )
    for o, e in zip(out, expected):
        assert np.all(np.isfinite(o)) and o.shape == e.shape
        np.testing.assert_allclose(o, e, rtol=1e-12, atol=1e-12 * scale)
    if scale > 1:  # the naive formula does overflow here, so stability is what is tested
        with np.errstate(all="ignore"):
            assert not np.all(np.isfinite(np.exp(x) / np.exp(x).sum(axis, keepdims=True)))


def test_softmax_f32_large_inputs():
    x = (rand(4, 6) * 1e4).astype(np.float32)
    out = traced(dq.softmax, x)
    assert out.dtype == np.float32 and np.all(np.isfinite(out))
    np.testing.assert_allclose(out, special.softmax(x.astype(np.float64), -1), atol=1e-6)
    np.testing.assert_allclose(out.sum(-1), 1, rtol=1e-6)


def test_logsumexp_all_axes_default():
    x = rand(3, 4) + 1e4
    out = traced(dq.logsumexp, x)
    assert np.shape(out) == () and np.isclose(out, special.logsumexp(x), rtol=1e-14)


def test_softmax_cross_entropy_against_direct_formula():
    logits = rand(6, 4) * 3
    onehot = np.eye(4)[RNG.integers(0, 4, 6)]
    out = traced(dq.softmax_cross_entropy, logits, onehot)
    direct = -np.log(np.exp(logits) / np.exp(logits).sum(1, keepdims=True))[onehot.astype(bool)]
    assert out.shape == (6,)
    np.testing.assert_allclose(out, direct, rtol=1e-12)
    big = traced(dq.softmax_cross_entropy, logits * 1e4, onehot)  # still finite
    np.testing.assert_allclose(
        big, 1e4 * (logits.max(1) - logits[onehot.astype(bool)]), rtol=1e-9, atol=1e-6
    )


# ------------------------------------------------------------------ tracing semantics


def mlp_loss(w1, b1, w2, b2, x, y):
    h = dq.relu(x @ w1 + b1)
    return dq.mean(dq.softmax_cross_entropy(h @ w2 + b2, y))


def mlp_args(dtype=np.float32):
    y = np.eye(3)[RNG.integers(0, 3, 5)].astype(dtype)
    return [
        rand(4, 8, dtype=dtype),
        rand(8, dtype=dtype),
        rand(8, 3, dtype=dtype),
        rand(3, dtype=dtype),
        rand(5, 4, dtype=dtype),
        y,
    ]


def numpy_mlp_loss(w1, b1, w2, b2, x, y):
    h = np.maximum(x @ w1 + b1, 0)
    z = h @ w2 + b2
    return np.mean(-(y * (z - special.logsumexp(z, 1, keepdims=True))).sum(1))


def test_mlp_traced_eager_and_numpy_agree():
    args = mlp_args(np.float64)
    expected = numpy_mlp_loss(*args)
    np.testing.assert_allclose(traced(mlp_loss, *args), expected, rtol=1e-12)
    np.testing.assert_allclose(mlp_loss(*args), expected, rtol=1e-12)  # eager on numpy
    args32 = mlp_args(np.float32)
    out = dq.jit(mlp_loss)(*args32)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, mlp_loss(*args32), rtol=1e-6)
    np.testing.assert_allclose(
        out, numpy_mlp_loss(*(a.astype(np.float64) for a in args32)), rtol=1e-5
    )


def test_python_loops_unroll_into_a_five_step_rnn():
    xs = rand(5, 3)  # concrete inputs, closed over: each step's row becomes a literal

    def rnn(h, wx, wh):
        for t in range(5):
            h = dq.tanh(xs[t] @ wx + h @ wh)
        return h

    h0, wx, wh = rand(4), rand(3, 4) * 0.5, rand(4, 4) * 0.5
    module = dq.make_ir(rnn)(h0, wx, wh)
    ops = [inst.op for inst in module["rnn"].body]
    assert ops.count("tanh") == 5 and ops.count("dot") == 10 and ops.count("literal") == 5
    h = h0
    for t in range(5):
        h = np.tanh(xs[t] @ wx + h @ wh)
    np.testing.assert_allclose(dq.interpret(module, "rnn", h0, wx, wh), h, rtol=1e-12)
    np.testing.assert_allclose(rnn(h0, wx, wh), h, rtol=1e-12)  # eager


def test_rnn_with_traced_inputs_per_step():
    def rnn(h, x0, x1, x2, x3, x4, wx, wh):
        for x in (x0, x1, x2, x3, x4):
            h = dq.tanh(x @ wx + h @ wh)
        return h

    args = [rand(2, 4)] + [rand(2, 3) for _ in range(5)] + [rand(3, 4), rand(4, 4)]
    module = dq.make_ir(rnn)(*args)
    assert [i.op for i in module["rnn"].body].count("tanh") == 5
    h, wx, wh = args[0], args[6], args[7]
    for x in args[1:6]:
        h = np.tanh(x @ wx + h @ wh)
    np.testing.assert_allclose(dq.interpret(module, "rnn", *args), h, rtol=1e-12)


def test_shape_error_names_op_shapes_and_user_line():
    def bad(a, b):
        return dq.relu(a) @ b  # <- matmul error here

    with pytest.raises(dq.ShapeError) as info:
        dq.make_ir(bad)(dq.spec((2, 3)), dq.spec((4, 5)))
    msg = str(info.value)
    assert f"{THIS_FILE}:{line_of('<- matmul error here')}:" in msg
    assert "matmul" in msg and "(2, 3)" in msg and "(4, 5)" in msg
    assert isinstance(info.value, dq.DlvmError)


@pytest.mark.parametrize(
    "fn,shapes,words",
    [
        (lambda a, b: a + b, [(2, 3), (4,)], ["add", "(2, 3)", "(4,)"]),  # <- broadcast error
        (lambda a, b: dq.where(a > 0, a, b), [(2, 3), (3, 2)], ["where", "(2, 3)", "(3, 2)"]),
        (lambda a: dq.reshape(a, (4, -1)), [(2, 3)], ["reshape", "(2, 3)", "(4, -1)"]),
        (lambda a: dq.sum(a, axis=2), [(2, 3)], ["sum", "axis 2"]),
        (
            lambda a, b: dq.concatenate([a, b], 1),
            [(2, 3), (3, 3)],
            ["concatenate", "(2, 3)", "(3, 3)"],
        ),
        (lambda a: dq.transpose(a, (0, 0)), [(2, 3)], ["transpose", "(2, 3)"]),
    ],
)
def test_shape_errors_at_trace_time(fn, shapes, words):
    with pytest.raises(dq.ShapeError) as info:
        dq.make_ir(fn)(*(dq.spec(s) for s in shapes))
    msg = str(info.value)
    assert THIS_FILE in msg
    for w in words:
        assert w in msg


def test_shape_error_line_for_broadcast():
    with pytest.raises(dq.ShapeError) as info:
        dq.make_ir(lambda a, b: a + b)(dq.spec((2, 3)), dq.spec((4,)))  # <- add error
    assert f"{THIS_FILE}:{line_of('<- add error')}:" in str(info.value)


def test_eager_shape_errors_too():
    with pytest.raises(dq.ShapeError, match=r"matmul of shapes \(2, 3\) and \(2, 3\)"):
        dq.matmul(np.ones((2, 3)), np.ones((2, 3)))


def test_instructions_carry_user_locations():
    def f(x):
        y = dq.exp(x)  # <- exp here
        return dq.sum(y * 2.0)  # <- sum here

    fn = dq.make_ir(f)(dq.spec((3,)))["f"]
    locs = {inst.op: inst.location for inst in fn.body}
    assert os.path.basename(locs["exp"][0]) == THIS_FILE
    assert locs["exp"][1] == line_of("<- exp here")
    assert locs["multiply"][1] == locs["reduce"][1] == line_of("<- sum here")
    assert locs["exp"][2] > 1  # the column of the call


def test_python_control_flow_on_traced_values_is_a_clear_error():
    def f(x):
        if dq.sum(x) > 0:
            return x
        return -x

    with pytest.raises(dq.TracingError, match="dq.where"):
        dq.make_ir(f)(dq.spec((3,)))
    with pytest.raises(
        dq.ShapeError, match="by a traced tensor is supported only as the whole index"
    ):
        dq.make_ir(lambda x, i: x[i, 0])(dq.spec((3, 2)), dq.spec((), "i32"))  # x[i] alone: a take


def test_leaked_tensor_is_reported():
    leaked = []
    dq.make_ir(lambda x: leaked.append(x) or x)(dq.spec((3,)))
    with pytest.raises(dq.TracingError, match="escaped"):
        dq.make_ir(lambda y: y + leaked[0])(dq.spec((3,)))


# ------------------------------------------------------------------ make_ir and jit


def test_make_ir_names_types_and_printing():
    def loss(w, x, n, flag):
        return dq.sum(dq.tanh(x @ w)) * n

    module = dq.make_ir(loss)(rand(3, 2), dq.spec((4, 3), "f64"), np.int32(3), True)
    assert isinstance(module, Module) and module.name == "loss"
    text = str(module)
    assert "func @loss: (<3 x 2 x f64>, <4 x 3 x f64>, i32, bool) -> f64" in text
    assert "'entry(%w: <3 x 2 x f64>, %x: <4 x 3 x f64>, %n: i32, %flag: bool)" in text
    assert "lambda" in str(dq.make_ir(lambda q: q)(1.0))
    assert "func @lambda: (f32) -> f32" in str(dq.make_ir(lambda q: q)(1.0))


def test_make_ir_tuple_results_and_round_trip():
    def pair(a, b):
        return [a * b, dq.exp(a)]

    module = dq.make_ir(pair)(dq.spec((2,)), dq.spec((2,)))
    assert module["pair"].result_type == dq.ir.TupleType((dq.ir.tensor(2, dq.ir.F32),) * 2)
    parser = pytest.importorskip("dlvm_eq.ir.parser")
    assert str(parser.parse(str(module))) == str(module)


def test_jit_caches_per_shape_and_dtype():
    calls = []

    def f(x, y):
        calls.append(x.shape)
        return dq.tanh(x) * y, dq.sum(x)

    jf = dq.jit(f)
    a, b = rand(3, 4, dtype=np.float32), rand(4, dtype=np.float32)
    out1 = jf(a, b)
    out2 = jf(a * 2, b)
    assert len(calls) == 1 and jf.cache_size() == 1
    assert isinstance(out1, tuple) and out1[0].dtype == np.float32
    np.testing.assert_allclose(out2[0], np.tanh(a * 2) * b, rtol=1e-6)
    jf(rand(5, 4, dtype=np.float32), b)  # new shape: retrace
    assert len(calls) == 2 and jf.cache_size() == 2
    jf(a.astype(np.float64), b.astype(np.float64))  # new dtypes: retrace
    assert len(calls) == 3 and jf.cache_size() == 3
    assert jf(a.astype(np.float64), b.astype(np.float64))[0].dtype == np.float64
    jf(a, b)
    assert len(calls) == 3
    lowered = jf.lower(a, b)
    assert "func @f: (<3 x 4 x f32>, <4 x f32>)" in str(lowered) and len(calls) == 3


def test_jit_targets_and_decorator():
    @dq.jit(target="interp")
    def g(x):
        return x * 3.0

    np.testing.assert_array_equal(g(np.arange(3.0)), np.arange(3.0) * 3)
    assert dq.jit(g.__wrapped__).target == dq.DEFAULT_TARGET
    with pytest.raises(dq.DlvmError, match="unknown target"):
        dq.jit(g, target="tpu")


def test_jit_inside_trace_traces_through():
    inner = dq.jit(lambda x: dq.exp(x))
    module = dq.make_ir(lambda x: inner(x) + 1.0)(dq.spec((2,)))
    assert [i.op for i in module["lambda"].body] == ["exp", "add"]
    assert inner.cache_size() == 0


def test_loss_prints_as_func_loss():
    def loss(w, x):
        return dq.mean(dq.square(x @ w))

    text = str(dq.make_ir(loss)(rand(3, 1), rand(5, 3)))
    assert "func @loss" in text and 'module "loss"' in text
