"""CPU kernels (dlvm_eq.codegen): every op against numpy float64, broadcasting, several
outputs, reductions, threads, the buffer pool, and the on-disk kernel cache."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dlvm_eq.codegen import (
    BINARY_OPS,
    UNARY_OPS,
    BufferPool,
    Cast,
    CpuKernel,
    KernelError,
    KernelInput,
    KernelSpec,
    Load,
    ReduceSpec,
    Select,
    binary,
    compile_cpu,
    cpu_ir,
    evaluate,
    set_cache_dir,
    unary,
)
from dlvm_eq.codegen.cpu.llvm_cpu import optimize
from dlvm_eq.codegen.kernels.layout import elementwise_layout
from dlvm_eq.codegen.kernels.reference import BINARY_NP, UNARY_NP
from dlvm_eq.codegen.kernels.spec import DTYPES, op_name

RNG = np.random.default_rng(1234)
SPECIAL = [
    0.0,
    -0.0,
    np.inf,
    -np.inf,
    np.nan,
    1.0,
    -1.0,
    0.5,
    -0.5,
    2.0,
    -2.0,
    1e-30,
    -1e-30,
    88.0,
    -88.0,
    89.0,
    -104.0,
    700.0,
    -745.0,
    710.0,
]


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def unary_inputs(op: str, n: int) -> np.ndarray:
    """Random inputs over the op's interesting range, plus tiny magnitudes."""
    if op in ("log", "sqrt", "rsqrt"):
        x = np.exp(RNG.uniform(-80, 80, n))
    elif op == "log1p":
        x = np.concatenate([np.exp(RNG.uniform(-30, 5, n // 2)), -RNG.uniform(0, 1, n - n // 2)])
    elif op in ("sin", "cos", "tan"):
        x = RNG.uniform(-100, 100, n)
    elif op in ("floor", "ceil", "round"):
        x = RNG.normal(0, 10, n)
        x[:8] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.0, -3.0]  # ties: round half to even
    else:
        x = RNG.uniform(-90, 90, n)
    x[n // 2 : n // 2 + n // 4] = RNG.normal(0, 1, n // 4) * np.exp(RNG.uniform(-20, 2, n // 4))
    return np.concatenate([x, SPECIAL])


def assert_matches_f64(got, ref64, dt, rtol64=4 * np.finfo(np.float64).eps, rtol32=2e-6):
    """f32: within rtol32 (default 2e-6) relative of the float64 result, rounded to f32 so that
    overflow to inf and subnormals compare fairly; f64: within a few ulp. NaN and inf match."""
    if dt == "f32":
        with np.errstate(over="ignore"):
            ref32 = ref64.astype(np.float32)
        np.testing.assert_allclose(
            got.astype(np.float64), ref32.astype(np.float64), rtol=rtol32, atol=3e-45
        )
    else:
        np.testing.assert_allclose(got, ref64, rtol=rtol64, atol=1e-300)


def run_one(spec, *arrays):
    return compile_cpu(spec)(*arrays)


# ------------------------------------------------------------------ elementwise ops

FLOAT_UNARY = sorted(op for op, dts in UNARY_OPS.items() if "f32" in dts)


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("op", FLOAT_UNARY)
def test_unary_float_op_matches_numpy_f64(op, dt):
    x = unary_inputs(op, 4000).astype(DTYPES[dt])
    spec = KernelSpec(op, x.shape, [KernelInput(dt)], [unary(op, Load(0))])
    got = run_one(spec, x)
    assert got.dtype == DTYPES[dt]
    # the per-op bound: 4 ulp in both precisions (measured: <= 2 ulp)
    assert_matches_f64(
        got, evaluate(spec, [x], compute="f64")[0], dt, rtol32=4 * np.finfo(np.float32).eps
    )


def test_unary_int_and_bool_ops_match_numpy():
    x = np.array([0, 1, -1, 7, -7, 2**31 - 1, -(2**31), 12345], dtype=np.int32)
    for op in ("neg", "square", "sign", "abs", "relu"):
        spec = KernelSpec(op, x.shape, [KernelInput("i32")], [unary(op, Load(0))])
        np.testing.assert_array_equal(run_one(spec, x), evaluate(spec, [x])[0], err_msg=op)
    m = np.array([True, False, True])
    spec = KernelSpec("not", m.shape, [KernelInput("bool")], [unary("not", Load(0))])
    np.testing.assert_array_equal(run_one(spec, m), ~m)


def binary_inputs(op: str, n: int, dt: str):
    if dt == "i32":
        a = RNG.integers(-1000, 1000, n).astype(np.int32)
        b = RNG.integers(-30, 30, n).astype(np.int32)
        a[:4], b[:4] = [7, -7, -(2**31), 5], [0, 2, -1, 0]  # x/0 and INT_MIN/-1 defined
        return a, b
    if op == "pow":
        a = np.concatenate([RNG.uniform(0, 10, n // 2), -RNG.uniform(0, 10, n - n // 2)])
        b = np.where(RNG.random(n) < 0.5, RNG.integers(-8, 8, n), RNG.uniform(-8, 8, n))
        sa = [0.0, -0.0, -0.0, 1.0, -1.0, np.nan, 2.0, np.inf, -np.inf, -np.inf, 0.5, -2.0, -1.0]
        sb = [-1.0, 3.0, -3.0, np.nan, np.inf, 0.0, np.inf, -2.0, 3.0, 0.5, -np.inf, 0.5, 1e30]
    else:
        a, b = RNG.normal(0, 10, n), RNG.normal(0, 10, n)
        b[: n // 8] = a[: n // 8]  # equal pairs for the comparisons
        sa = [0.0, 1.0, np.inf, -np.inf, np.nan, 1.0, np.nan, -0.0, np.inf]
        sb = [0.0, 0.0, np.inf, 1.0, 1.0, np.nan, np.nan, 0.0, -np.inf]
    return (np.concatenate([a, sa]).astype(DTYPES[dt]), np.concatenate([b, sb]).astype(DTYPES[dt]))


BINARY_CASES = [
    (op, dt) for op, (dts, _) in sorted(BINARY_OPS.items()) for dt in dts if dt != "bool"
]


@pytest.mark.parametrize("op,dt", BINARY_CASES)
def test_binary_op_matches_numpy(op, dt):
    a, b = binary_inputs(op, 3000, dt)
    spec = KernelSpec(
        op, a.shape, [KernelInput(dt), KernelInput(dt)], [binary(op, Load(0), Load(1))]
    )
    got = run_one(spec, a, b)
    if dt == "i32" or BINARY_OPS[op][1] == "bool":
        np.testing.assert_array_equal(got, evaluate(spec, [a, b])[0])
    else:
        assert_matches_f64(
            got,
            evaluate(spec, [a, b], compute="f64")[0],
            dt,
            rtol64=1e-13 if op == "pow" else 4 * np.finfo(np.float64).eps,
        )


def test_logic_ops_and_select():
    p = np.array([True, True, False, False])
    q = np.array([True, False, True, False])
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    spec = KernelSpec(
        "logic",
        (4,),
        [KernelInput("bool"), KernelInput("bool"), KernelInput("f32")],
        [
            binary("and", Load(0), Load(1)),
            binary("or", Load(0), Load(1)),
            binary("eq", Load(0), Load(1)),
            Select(Load(0), Load(2), -Load(2)),
        ],
    )
    a, o, e, s = run_one(spec, p, q, x)
    np.testing.assert_array_equal(a, p & q)
    np.testing.assert_array_equal(o, p | q)
    np.testing.assert_array_equal(e, p == q)
    np.testing.assert_array_equal(s, np.where(p, x, -x))


@pytest.mark.parametrize("src", ["f32", "f64", "i32", "bool"])
def test_casts_match_numpy(src):
    x = {
        "f32": np.array([0, -0.0, 1.5, -2.5, 1e6, 3.99, -3.99], np.float32),
        "f64": np.array([0, 1.5, -2.5, 1e9, 1e-300, 3.99, -3.99]),
        "i32": np.array([0, 1, -1, 2**31 - 1, -(2**31), 7, 1 << 24 | 1], np.int32),
        "bool": np.array([True, False, True, True, False, False, True]),
    }[src]
    spec = KernelSpec("cast", x.shape, [KernelInput(src)], [Cast(Load(0), d) for d in DTYPES])
    for got, d in zip(run_one(spec, x), DTYPES):
        np.testing.assert_array_equal(got, x.astype(DTYPES[d]), err_msg=f"{src} -> {d}")


def test_float_to_int_cast_saturates_and_maps_nan_to_zero():
    x = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, -1.5], np.float32)
    spec = KernelSpec(
        "sat", x.shape, [KernelInput("f32")], [Cast(Load(0), "i32"), Cast(Load(0), "bool")]
    )
    i, b = run_one(spec, x)
    np.testing.assert_array_equal(i, [0, 2**31 - 1, -(2**31), 2**31 - 1, -(2**31), -1])
    np.testing.assert_array_equal(b, [True, True, True, True, True, True])  # NaN is truthy


# ------------------------------------------------------------------ sizes, threads, layouts


def silu_spec(shape, dt="f32"):
    x = Load(0)
    return KernelSpec("silu", shape, [KernelInput(dt)], [unary("sigmoid", x * 1.5 + 0.25) * x])


@pytest.mark.parametrize("n", [1, 7, 1000003])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_sizes_and_thread_split(n, dt):
    x = RNG.normal(0, 3, n).astype(DTYPES[dt])
    spec = silu_spec((n,), dt)
    want = evaluate(spec, [x], compute="f64")[0]
    assert_matches_f64(compile_cpu(spec)(x), want, dt, rtol64=1e-14)
    # an odd thread count: chunk boundaries that are not a divisor of n
    assert_matches_f64(CpuKernel(spec, threads=3)(x), want, dt, rtol64=1e-14)


@pytest.mark.parametrize("aligned_out", [True, False])
def test_streaming_stores_for_large_outputs(monkeypatch, aligned_out):
    """Large outputs go through an L1 tile and non-temporal stores; any size, several
    outputs of different widths, broadcast inputs, and unaligned `out=` arrays all work."""
    from dlvm_eq.codegen.cpu import llvm_cpu
    from dlvm_eq.codegen.runtime.buffers import aligned_empty

    monkeypatch.setattr(llvm_cpu, "NT_MIN_BYTES", 0)  # stream even these small test outputs
    shape = (7, 33_333)
    x = RNG.normal(size=shape).astype(np.float64)
    col = RNG.normal(size=(7, 1)).astype(np.float64)
    spec = KernelSpec(
        "stream",
        shape,
        [KernelInput("f64"), KernelInput.broadcast("f64", (7, 1), shape)],
        [unary("exp", Load(0)) - Load(1), binary("gt", Load(0), Load(1))],
    )
    kir = cpu_ir(spec)
    assert "!nontemporal" in kir.text

    def alloc(dt):  # 64-byte aligned, or deliberately one element off
        if aligned_out:
            return aligned_empty(shape, dt)
        return aligned_empty((x.size + 1,), dt)[1:].reshape(shape)

    got = CpuKernel(spec, threads=3)(x, col, out=(alloc(np.float64), alloc(np.bool_)))
    np.testing.assert_allclose(got[0], np.exp(x) - col, rtol=1e-15, atol=1e-15 * np.abs(col).max())
    np.testing.assert_array_equal(got[1], x > col)


def test_empty_and_scalar_shapes():
    spec = silu_spec((0, 5))
    assert compile_cpu(spec)(np.zeros((0, 5), np.float32)).shape == (0, 5)
    k = compile_cpu(
        KernelSpec("s", (), [KernelInput("f32"), KernelInput("f32")], [Load(0) * Load(1) + 1.0])
    )
    assert k(np.float32(3), np.array(2, np.float32)) == np.float32(7)  # numpy scalars are accepted
    total = compile_cpu(ReduceSpec("r", (5,), [KernelInput("f64")], Load(0), "add", (0,)))(
        np.arange(5.0)
    )
    assert total.shape == () and total == 10.0
    x = np.arange(15.0).reshape(5, 3)
    np.testing.assert_array_equal(
        compile_cpu(ReduceSpec("id", x.shape, [KernelInput("f64")], Load(0), "max", ()))(x), x
    )


BROADCASTS = {  # name: (out shape, input shape)
    "row": ((37, 129), (129,)),
    "column": ((37, 129), (37, 1)),
    "scalar": ((37, 129), ()),
    "3d-middle": ((5, 6, 70), (6, 1)),
    "3d-outer": ((5, 6, 70), (5, 1, 70)),
}


@pytest.mark.parametrize("case", sorted(BROADCASTS))
def test_broadcast_inputs(case):
    out_shape, in_shape = BROADCASTS[case]
    x = RNG.normal(size=out_shape).astype(np.float32)
    y = RNG.normal(size=in_shape).astype(np.float32)
    spec = KernelSpec(
        case,
        out_shape,
        [KernelInput("f32"), KernelInput.broadcast("f32", in_shape, out_shape)],
        [unary("tanh", Load(0)) * Load(1) - Load(1)],
    )
    want = np.tanh(x.astype(np.float64)) * y - y.astype(np.float64)
    np.testing.assert_allclose(
        compile_cpu(spec)(x, y), want, rtol=2e-6, atol=3e-7 * np.abs(y).max()
    )


def test_transposed_input_through_strides():
    a = RNG.normal(size=(300, 200))  # read as a.T: shape (200, 300)
    spec = KernelSpec(
        "t", (200, 300), [KernelInput("f64", (1, 200)), KernelInput("f64")], [Load(0) - Load(1)]
    )
    b = RNG.normal(size=(200, 300))
    np.testing.assert_array_equal(compile_cpu(spec)(a, b), a.T - b)


def test_contiguous_dims_are_merged_into_one_flat_loop():
    assert elementwise_layout((4, 5, 6), [None, (0, 0, 0)]).dims == (120,)
    assert elementwise_layout((4, 5, 6), [None, (0, 6, 1)]).dims == (4, 30)
    # the IR depends on the pattern, not the sizes: one compiled kernel per pattern
    x = Load(0)
    s1 = KernelSpec(
        "a",
        (8, 16),
        [KernelInput("f32"), KernelInput.broadcast("f32", (16,), (8, 16))],
        [x + Load(1)],
    )
    s2 = KernelSpec(
        "b",
        (9, 17),
        [KernelInput("f32"), KernelInput.broadcast("f32", (17,), (9, 17))],
        [x + Load(1)],
    )
    assert cpu_ir(s1).symbol == cpu_ir(s2).symbol


def test_multi_output_kernel_shares_subexpressions():
    x, y = Load(0), Load(1)
    e = unary("exp", x - y)
    spec = KernelSpec(
        "multi",
        (1000,),
        [KernelInput("f32"), KernelInput("f32")],
        [e * 2.0, binary("gt", e, 1.0), Cast(e, "i32"), e],
    )
    a = RNG.normal(size=1000).astype(np.float32)
    b = RNG.normal(size=1000).astype(np.float32)
    o1, o2, o3, o4 = compile_cpu(spec)(a, b)
    ref = np.exp(a.astype(np.float64) - b)
    assert_matches_f64(o1, 2 * ref, "f32")
    assert o2.dtype == np.bool_ and o3.dtype == np.int32
    np.testing.assert_array_equal(o2, o4 > 1.0)
    np.testing.assert_array_equal(o3, o4.astype(np.int32))


# ------------------------------------------------------------------ reductions

REDUCTIONS = [  # (shape, axes)
    ((64, 1000), (1,)),
    ((1000, 64), (0,)),
    ((37, 5, 11), (0, 1, 2)),
    ((10, 20, 30), (1,)),
    ((10, 20, 30), (0, 2)),
    ((6, 7, 8, 9), (1, 3)),
    ((300001,), (0,)),
    ((3, 400000), (1,)),
    ((400000, 3), (0,)),
]


@pytest.mark.parametrize("shape,axes", REDUCTIONS)
@pytest.mark.parametrize("op", ["add", "max"])
def test_reduction_matches_numpy(shape, axes, op):
    x = RNG.normal(size=shape)
    spec = ReduceSpec("r", shape, [KernelInput("f64")], unary("exp", Load(0) * 0.5), op, axes)
    got = compile_cpu(spec)(x)
    want = getattr(np, "sum" if op == "add" else "max")(np.exp(x * 0.5), axis=axes)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("op", ["add", "mul", "max", "min"])
def test_reduction_ops_f32_i32_and_init(op):
    x = RNG.uniform(0.9, 1.1, size=(50, 40)).astype(np.float32)
    spec = ReduceSpec("r", x.shape, [KernelInput("f32")], Load(0), op, (1,))
    want = {"add": np.sum, "mul": np.prod, "max": np.max, "min": np.min}[op](
        x.astype(np.float64), axis=1
    )
    np.testing.assert_allclose(compile_cpu(spec)(x), want, rtol=2e-6)
    xi = RNG.integers(-50, 50, size=(50, 40)).astype(np.int32)
    spec = ReduceSpec(
        "ri", xi.shape, [KernelInput("i32")], Load(0), op, (0,), init=3 if op == "add" else None
    )
    want = {
        "add": lambda a, axis: np.sum(a, axis=axis) + 3,
        "mul": np.prod,
        "max": np.max,
        "min": np.min,
    }[op](xi, axis=0).astype(np.int32)
    np.testing.assert_array_equal(compile_cpu(spec)(xi), want)


@pytest.mark.parametrize("threads", [1, 3])
def test_init_is_applied_once_when_a_reduction_is_split_over_threads(threads):
    x = np.ones(1_000_003)
    add = ReduceSpec("s", x.shape, [KernelInput("f64")], Load(0), "add", (0,), init=3.0)
    mul = ReduceSpec("p", x.shape, [KernelInput("f64")], Load(0) * 1.0, "mul", (0,), init=2.0)
    mx = ReduceSpec("m", x.shape, [KernelInput("f64")], Load(0), "max", (0,), init=5.0)
    assert CpuKernel(add, threads=threads)(x) == 1_000_006.0
    assert CpuKernel(mul, threads=threads)(x) == 2.0
    assert CpuKernel(mx, threads=threads)(x) == 5.0


def test_max_reduction_propagates_nan_and_empty_axis_gives_init():
    x = np.ones((4, 1000))
    x[2, 500] = np.nan
    spec = ReduceSpec("r", x.shape, [KernelInput("f64")], Load(0), "max", (1,))
    np.testing.assert_array_equal(np.isnan(compile_cpu(spec)(x)), [False, False, True, False])
    spec = ReduceSpec("e", (3, 0), [KernelInput("f64")], Load(0), "max", (1,))
    np.testing.assert_array_equal(compile_cpu(spec)(np.zeros((3, 0))), [-np.inf] * 3)


def test_softmax_as_two_reductions_and_one_map():
    x = (RNG.normal(size=(257, 1000)) * 5).astype(np.float32)
    shape = x.shape
    col = KernelInput.broadcast("f32", (shape[0], 1), shape)
    rowmax = compile_cpu(ReduceSpec("max", shape, [KernelInput("f32")], Load(0), "max", (1,)))(x)
    e = unary("exp", Load(0) - Load(1))
    rowsum = compile_cpu(ReduceSpec("sum", shape, [KernelInput("f32"), col], e, "add", (1,)))(
        x, rowmax
    )
    out = compile_cpu(KernelSpec("norm", shape, [KernelInput("f32"), col, col], [e / Load(2)]))(
        x, rowmax, rowsum
    )
    x64 = x.astype(np.float64)
    want = np.exp(x64 - x64.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-30)


# ------------------------------------------------------------------ code quality and errors


def test_polynomial_math_vectorizes_and_calls_no_libm():
    x = Load(0)
    spec = KernelSpec(
        "mix",
        (1024,),
        [KernelInput("f32")],
        [unary("sigmoid", x) + unary("log1p", x) + unary("tanh", x) + unary("softplus", x)],
    )
    opt = str(optimize(cpu_ir(spec).text))
    assert "x float>" in opt, "the loop was not vectorized"
    calls = re.findall(r"call [^@]*@([\w.]+)", opt)
    assert calls and all(c.startswith("llvm.") for c in calls), calls  # intrinsics only


def test_type_errors_are_kernel_errors():
    with pytest.raises(KernelError, match="different dtypes"):
        KernelSpec("bad", (3,), [KernelInput("f32"), KernelInput("f64")], [Load(0) + Load(1)])
    with pytest.raises(KernelError, match="exp: operand dtype i32"):
        KernelSpec("bad", (3,), [KernelInput("i32")], [unary("exp", Load(0))])
    with pytest.raises(KernelError, match="unknown unary op"):
        KernelSpec("bad", (3,), [KernelInput("f32")], [unary("frobnicate", Load(0))])
    with pytest.raises(KernelError, match="Load\\(1\\)"):
        KernelSpec("bad", (3,), [KernelInput("f32")], [Load(1)])
    with pytest.raises(KernelError, match="cannot broadcast"):
        KernelInput.broadcast("f32", (4,), (3, 5))
    k = compile_cpu(silu_spec((10,)))
    with pytest.raises(KernelError, match="float32 array with at least 10 elements, got float64"):
        k(np.zeros(10))
    with pytest.raises(KernelError, match="at least 10 elements, got float32 \\(5,\\)"):
        k(np.zeros(5, np.float32))


# numpy written out independently of the op table: what the kernels' oracle must compute
INDEPENDENT_NP = {
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "sqrt": np.sqrt,
    "rsqrt": lambda v: 1.0 / np.sqrt(v),
    "square": np.square,
    "sign": np.sign,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.rint,
    "abs": np.abs,
    "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
    "relu": lambda v: np.maximum(v, 0.0),
    "log1p": np.log1p,
    "expm1": np.expm1,
    "softplus": lambda v: np.logaddexp(0.0, v),
    "not": np.logical_not,
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "pow": np.power,
    "min": np.minimum,
    "max": np.maximum,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "and": np.logical_and,
    "or": np.logical_or,
    "div": np.true_divide,
}


def test_every_elementwise_ir_op_has_a_kernel_op_with_numpys_semantics():
    """Every elementwise IR op has a kernel op, and the oracle the kernels are tested against
    (derived from the op table) computes what numpy written out by hand computes."""
    from dlvm_eq.ir.ops import ELEMENTWISE_OPS, OPS

    x = np.array([-2.5, -1.0, -0.0, 0.3, 1.0, 2.5, 7.0])
    y = np.array([1.5, -1.0, 2.0, 0.3, -4.0, 2.0, 0.5])
    checked = 0
    for name in set(ELEMENTWISE_OPS) - {"select"}:  # select is the Select node
        short, ir_op = op_name(name), OPS[name]
        if ir_op.arity == 1:
            assert short in UNARY_OPS, name
            args = [x > 0] if short == "not" else [x]
        else:
            assert short in BINARY_OPS, name
            args = [x > 0, y > 0] if short in ("and", "or") else [np.abs(x), y]
        if short not in INDEPENDENT_NP:
            continue  # e.g. erf: tested against mpmath in tests/test_erf.py
        with np.errstate(all="ignore"):
            want = INDEPENDENT_NP[short](*args)
            got = (
                UNARY_NP[short](*args)
                if ir_op.arity == 1
                else np.true_divide(*args)
                if short == "div"
                else BINARY_NP[short](*args)
            )
        np.testing.assert_allclose(got, want, rtol=1e-15, err_msg=name)
        checked += 1
    assert checked >= 35


def test_dlvm_op_names_are_accepted():
    spec = KernelSpec(
        "d", (3,), [KernelInput("f32")], [binary("multiply", unary("negate", Load(0)), 2.0)]
    )
    np.testing.assert_array_equal(run_one(spec, np.array([1, 2, 3], np.float32)), [-2, -4, -6])


def test_buffer_pool_reuses_output_buffers():
    pool = BufferPool()
    k = CpuKernel(silu_spec((4096,)), pool=pool)
    x = np.ones(4096, np.float32)
    y = k(x)
    pool.release(y)
    assert k(x) is y and pool.hits == 1 and pool.misses == 1
    pool.release(y[:10])  # a view is not taken back
    assert pool.bytes_free == 0


def test_kernel_op_tables_are_the_op_tables_elementwise_ops_and_nothing_else():
    """UNARY_OPS and BINARY_OPS come from the IR op table's kinds: every kernel op is an IR op
    of its arity; comparisons give bool, logic takes bool, float-only ops take floats only."""
    from dlvm_eq.ir.ops import BINARY, COMPARE, LOGIC, OPS, UNARY

    short = {op_name(n): s for n, s in OPS.items()}
    assert set(UNARY_OPS) == {
        k for k, s in short.items() if s.kind in (UNARY, LOGIC) and s.arity == 1
    }
    assert set(BINARY_OPS) == {
        k for k, s in short.items() if s.kind in (BINARY, COMPARE, LOGIC) and s.arity == 2
    }
    for k, (dts, result) in BINARY_OPS.items():
        kind = short[k].kind
        assert result == (None if kind == BINARY else "bool"), k
        assert ("bool" in dts) == (kind == LOGIC or k in ("eq", "ne")), k
        assert ("i32" in dts) == (kind != LOGIC and not short[k].float_only), k
