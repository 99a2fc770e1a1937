"""Differential: compiled programs (cpu) agree with the reference interpreter.

- f64 and i32 random programs of every op kind: within 1e-9 relative (f64 polynomial math is
  good to a few ulp) and exactly for integers;
- f32 random programs against the float64 interpreter: within 2e-6 x (1 + ops / 4) relative
  to |result| + 1e-3 x the output's scale (f32 rounding compounds along a program; the
  interpreter's own f32 run stays within the same bound);
- every op of the op table through the compiled path, f32 against float64 within 2e-6;
- odd sizes (1, 7, 1000003), non-contiguous arguments (transposed, strided, broadcast views),
  broadcasting operands, and the optimized program (dq.optimize) compiled as well.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_programs import GUARDS, random_function, random_inputs

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.ir import BOOL, F32, F64, I32, FunctionBuilder, Module, interpret, tensor
from dlvm_eq.ir.ops import (
    BINARY,
    BIT_OPS,
    CAST,
    COMPARE,
    DOT,
    LAYOUT,
    LOGIC,
    OPS,
    REDUCE,
    SELECT,
    UNARY,
)
from dlvm_eq.pipeline import compile

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _agree(fn, *, optimize=False, rtol=1e-9, seed=0):
    m = Module("random")
    m.add(fn)
    compiled = compile(m, fn.name, optimize=optimize)
    args = random_inputs(fn, np.random.default_rng(seed))
    f64 = fn.params and fn.params[0].type.dtype is F32
    want = _tuple(interpret(m, fn.name, *args, float64=bool(f64)))
    assert_close(_tuple(compiled(*args)), want, rtol, f"\n{fn}\n{compiled.plan}")
    return compiled


def assert_close(got, want, rtol, context: str) -> None:
    """Each result within rtol of the interpreter's (relative, with a floor of 1e-3 of the
    largest finite value), NaN where it has NaN; non-float results exactly."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        if w.dtype.kind == "f":
            finite = w[np.isfinite(w)]
            scale = max(1.0, float(np.abs(finite).max(initial=0.0)))
            err = np.abs(g.astype(np.float64) - w)
            ok = (err <= rtol * (np.abs(w) + 1e-3 * scale)) | (np.isnan(g) & np.isnan(w)) | (g == w)
            assert ok.all(), f"{context}\nmax error {err[~ok].max()} at {np.argwhere(~ok)[:3]}"
        else:
            np.testing.assert_array_equal(g, w, err_msg=context)


@settings(max_examples=60, **SETTINGS)
@given(st.data())
def test_random_f64_programs_of_every_kind(data):
    _agree(random_function(data.draw, n_ops=data.draw(st.integers(1, 28)), dtype=F64))


@settings(max_examples=25, **SETTINGS)
@given(st.data())
def test_random_i32_programs_are_exact(data):
    _agree(random_function(data.draw, n_ops=data.draw(st.integers(1, 24)), dtype=I32))


@settings(max_examples=40, **SETTINGS)
@given(st.data())
def test_random_f32_programs_against_float64(data):
    n = data.draw(st.integers(1, 24))
    _agree(random_function(data.draw, n_ops=n, dtype=F32), rtol=2e-6 * (1 + n / 4))


@settings(max_examples=10, **SETTINGS)
@given(st.data())
def test_optimized_programs_compile_and_agree(data):
    _agree(
        random_function(data.draw, n_ops=data.draw(st.integers(4, 20)), dtype=F64), optimize=True
    )


# ---------------------------------------------------------------- every op

X = np.random.default_rng(1).standard_normal((33, 17)).astype(np.float32)
Y = np.random.default_rng(2).standard_normal((33, 17)).astype(np.float32)


def _domain(guard, x):
    """An operand in the op's domain (the random programs' guards)."""
    return np.abs(x) + 1 if guard == "positive" else np.tanh(x) if guard == "bounded" else x


def _one_op(op, types, args, rtol=2e-6, **attrs):
    """Compile a function of one `op` instruction and compare with the float64 interpreter."""
    b = FunctionBuilder("f", types)
    fn = b.finish(b.emit(op, list(b.params), **attrs))
    m = Module("op")
    m.add(fn)
    got = _tuple(compile(m, "f", optimize=False)(*args))
    want = _tuple(interpret(m, "f", *args, float64=True))
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype or w.dtype.kind == "f"
        if w.dtype.kind == "f":
            w32 = w.astype(g.dtype)  # rounded to f32: overflow and subnormals compare fairly
            np.testing.assert_allclose(g, w32, rtol=rtol, atol=1e-37, err_msg=op)
        else:
            np.testing.assert_array_equal(g, w, err_msg=op)


T = tensor(33, 17, F32)
ROW = tensor(17, F32)


@pytest.mark.parametrize("op", sorted(n for n, s in OPS.items() if s.kind == UNARY))
def test_every_unary_op_compiled(op):
    _one_op(op, [T], [_domain(GUARDS.get(op, (None,))[0], X)])


@pytest.mark.parametrize(
    "op", sorted(n for n, s in OPS.items() if s.kind in (BINARY, COMPARE) and n not in BIT_OPS)
)
def test_every_binary_and_compare_op_compiled(op):
    ga, gb = GUARDS.get(op, (None, None))
    # the second operand is a row broadcast over the first's rows
    _one_op(op, [T, ROW], [_domain(ga, X), _domain(gb, Y[0])])


@pytest.mark.parametrize("op", sorted(BIT_OPS))
def test_bit_ops_compiled_on_i32_words(op):
    rng = np.random.default_rng(sorted(BIT_OPS).index(op))
    words = rng.integers(-(2**31), 2**31, size=(33, 17), dtype=np.int64).astype(np.int32)
    counts = rng.integers(0, 40, size=17).astype(np.int32)  # shift counts are taken mod 32
    _one_op(op, [tensor(33, 17, I32), tensor(17, I32)], [words, counts])


@pytest.mark.parametrize("op", sorted(n for n, s in OPS.items() if s.kind == LOGIC))
def test_logic_ops_compiled(op):
    a, c = X > 0, Y < 0.5
    if op == "not":
        _one_op(op, [tensor(33, 17, BOOL)], [a])
    else:
        _one_op(op, [tensor(33, 17, BOOL), tensor(33, 17, BOOL)], [a, c])


def test_select_and_casts_compiled():
    _one_op("select", [T, ROW, tensor(33, 17, BOOL)], [X, Y[0], X > Y])
    for src, arr in (
        (F32, X),
        (F64, X.astype(np.float64)),
        (I32, (X * 10).astype(np.int32)),
        (BOOL, X > 0),
    ):
        for dst in (F32, F64, I32, BOOL):
            if src.is_float and dst is I32:
                arr = np.round(arr * 10)  # in range: float -> int of inf/NaN is undefined
            _one_op("dataTypeCast", [tensor(33, 17, src)], [arr], dtype=dst)


@pytest.mark.parametrize("comb", ["add", "multiply", "max", "min"])
@pytest.mark.parametrize("axes", [(0,), (1,), (0, 1), (1, 0)])
def test_reductions_compiled(comb, axes):
    x = np.tanh(X) + 1.0 if comb == "multiply" else X
    _one_op(
        "reduce",
        [T],
        [x],
        rtol=2e-5 if comb == "multiply" else 2e-6,
        combinator=comb,
        init=0.5,
        axes=axes,
    )


@pytest.mark.parametrize(
    "a, b", [((33, 17), (17, 5)), ((33, 17), (17,)), ((17,), (17, 5)), ((17,), (17,))]
)
def test_dot_compiled(a, b):
    rng = np.random.default_rng(6)
    args = [rng.standard_normal(a).astype(np.float32), rng.standard_normal(b).astype(np.float32)]
    _one_op("dot", [tensor(*a, F32), tensor(*b, F32)], args, rtol=1e-5)


@pytest.mark.parametrize(
    "op, attrs",
    [
        ("transpose", {}),
        ("transpose", {"perm": (1, 0)}),
        ("shapeCast", {"shape": (17, 3, 11)}),
        ("padShape", {"at": 1}),
        ("squeezeShape", None),
        ("broadcast", {"shape": (2, 33, 17)}),
    ],
)
def test_layout_ops_compiled(op, attrs):
    if attrs is None:
        _one_op(op, [tensor(33, 1, 17, F32)], [X.reshape(33, 1, 17)], at=1)
    else:
        _one_op(op, [T], [X], **attrs)


def test_literals_and_concatenate_compiled():
    b = FunctionBuilder("f", [T, ROW])
    x, r = b.params
    lit = b.emit("literal", [], value=np.arange(17, dtype=np.float32), type=ROW)
    two = b.emit("literal", [], value=2.0, type=T)
    y = b.emit("multiply", [b.emit("add", [x, lit]), two])
    cat = b.emit(
        "concatenate", [y, b.emit("padShape", [r], at=0), b.emit("padShape", [lit], at=0)], axis=0
    )
    fn = b.finish([cat, lit, two])
    m = Module("lit")
    m.add(fn)
    got = compile(m, "f", optimize=False)(X, Y[0])
    want = interpret(m, "f", X, Y[0])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    assert not np.shares_memory(got[1], compile(m, "f", optimize=False)(X, Y[0])[1])


# ---------------------------------------------------------------- sizes, views, broadcasting


def _run_both(fn, *args, rtol=2e-6):
    """dq.jit(fn) against the float64 interpreter on the traced IR."""
    f = dq.jit(fn)
    got = _tuple(f(*args))
    module = f.lower(*args)
    want = _tuple(interpret(module, next(iter(module.functions)), *args, float64=True))
    for g, w in zip(got, want):
        assert g.shape == w.shape
        if w.dtype.kind == "f":
            scale = max(1.0, float(np.abs(w).max(initial=0.0)))
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale)  # cancellation: scale
        else:
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("n", [1, 7, 1000003])
def test_odd_sizes(n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)

    def f(x):
        y = dq.sigmoid(x * 1.5 + 0.25) * x
        return y, dq.sum(y), dq.max(dq.exp(dq.tanh(x)))

    _run_both(f, x, rtol=2e-6 if n < 1000 else 2e-5)


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (7, 1), (3, 1000003 // 3)])
def test_odd_shapes_through_row_kernels(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    _run_both(lambda x: dq.softmax(x, axis=1), x)


def test_non_contiguous_arguments():
    base = np.random.default_rng(3).standard_normal((70, 60)).astype(np.float32)
    views = [
        base.T[:17, :33].T,
        base[::2, ::3][:33, :17],
        np.broadcast_to(base[0, :17], (33, 17)),
        np.asfortranarray(X),
    ]
    f = dq.jit(lambda a, b: dq.exp(a) * b - dq.sum(a, axis=0))
    for a in views:
        for b in views:
            want = np.exp(a.astype(np.float64)) * b - a.astype(np.float64).sum(axis=0)
            np.testing.assert_allclose(f(a, b), want, rtol=2e-6, atol=1e-5)
    w = np.random.default_rng(4).standard_normal((17, 20)).astype(np.float32)
    g = dq.jit(lambda a, w: dq.relu(a @ w))
    np.testing.assert_allclose(
        g(views[0], w[:, ::-1]), np.maximum(views[0] @ w[:, ::-1], 0), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "shapes",
    [
        [(33, 17), (17,)],
        [(33, 1), (1, 17)],
        [(), (33, 17)],
        [(2, 1, 17), (33, 1)],
        [(33, 17), (33, 17), (1,)],
    ],
)
def test_broadcasting(shapes):
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]

    def f(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = out * dq.tanh(x) + x
        return out, dq.sum(out, axis=-1)

    _run_both(f, *args, rtol=1e-5)


def test_python_and_numpy_scalars_and_int64_arguments():
    f = dq.jit(lambda x, s, k: x * s + dq.astype(k, np.float32))
    k = np.arange(17)  # int64 traces as i32
    x = X.astype(np.float64)
    np.testing.assert_allclose(f(X, 2.0, k), x * 2 + k, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(f(X, np.float32(3), k), x * 3 + k, rtol=1e-6, atol=1e-6)
    assert f.cache_size() == 1  # a Python float and an f32 scalar trace alike


# ---------------------------------------------------------------- row kernels (reduce, then map)


def _layernorm(x):
    mu = dq.mean(x, axis=-1, keepdims=True)
    var = dq.mean(dq.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * dq.rsqrt(var + 1e-5)


ROW_PROGRAMS = {
    "softmax": lambda x: dq.softmax(x, axis=-1),
    "log_softmax": lambda x: dq.log_softmax(x, axis=-1),
    "layernorm": _layernorm,
    "l2_normalize": lambda x: x / dq.sqrt(dq.sum(x * x, axis=-1, keepdims=True) + 1.0),
    "minmax_scale": lambda x: (
        (x - dq.min(x, axis=-1, keepdims=True))
        / (dq.max(x, axis=-1, keepdims=True) - dq.min(x, axis=-1, keepdims=True) + 1.0)
    ),
    "two_trailing_axes": lambda x: x - dq.logsumexp(x, axis=(1, 2), keepdims=True),
}


@pytest.mark.parametrize("name", sorted(ROW_PROGRAMS))
@pytest.mark.parametrize("shape", [(1, 1, 9), (5, 3, 7), (6, 1, 32), (3, 2, 33), (2, 4, 257)])
def test_row_kernel_programs(name, shape):
    from dlvm_eq.codegen.planning.plan import RowStep

    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    f = ROW_PROGRAMS[name]
    _run_both(f, x, rtol=1e-5)
    assert any(isinstance(s, RowStep) for s in dq.jit(f).report(x).plan.steps)


@settings(max_examples=40, **SETTINGS)
@given(st.data())
def test_random_f32_programs_through_our_gemm_and_epilogues(data):
    """The same, with every float32 matrix product (however small) through our GEMM, so that
    random programs reach its edge tiles and the epilogues fused into it."""
    from dlvm_eq.codegen.runtime import gemm_runtime

    calls = []
    real = gemm_runtime.CpuGemm.__call__

    def counted(self, a, b, out, accumulate=False, epilogue=None, extra=()):
        calls.append(a.shape)
        return real(self, a, b, out, accumulate, epilogue, extra)

    saved = gemm_runtime.GEMM_MIN_MACS
    gemm_runtime.GEMM_MIN_MACS = 1
    gemm_runtime.CpuGemm.__call__ = counted
    try:
        n = data.draw(st.integers(1, 24))
        compiled = _agree(
            random_function(data.draw, n_ops=n, dtype=F32, kinds=GEMM_KINDS),
            rtol=2e-6 * (1 + n / 4),
        )
    finally:
        gemm_runtime.GEMM_MIN_MACS = saved
        gemm_runtime.CpuGemm.__call__ = real
    products = [
        b
        for b in compiled.plan.blas_calls
        if len(b.a.shape) == 2 and len(b.b.shape) == 2 and 0 not in b.a.shape + b.b.shape
    ]
    assert len(calls) >= len(products) > 0 or not products


GEMM_KINDS = (DOT, DOT, UNARY, BINARY, COMPARE, SELECT, REDUCE, LAYOUT, CAST)
