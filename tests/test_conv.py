"""conv2d, conv1d, max_pool2d and avg_pool2d end to end: against an independent float64
reference (direct loops over the kernel taps, written here with numpy slices) and PyTorch
where it is installed, in the interpreter and compiled for the CPU; gradients against central
differences; the IR syntax, its round trip and located errors; DSL attribute errors; and a
small CNN's value_and_grad compiled for the CPU against the interpreter and central differences.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from window_cases import case_window, conv_case, pool_case, ref_conv2d, ref_pool

import dlvm_eq as dq
from dlvm_eq.errors import DlvmError, SourceError
from dlvm_eq.ir import Module, interpret
from dlvm_eq.ir.parser import parse
from dlvm_eq.ir.printer import print_module
from dlvm_eq.ir.window_ops import WINDOW_OPS
from dlvm_eq.pipeline import check_grads


def _rng(seed):
    return np.random.default_rng(seed)


def _sym(padding):
    """padding (t, b, l, r) as the DSL's pair when both sides are alike, else None."""
    return (
        (padding[0], padding[2]) if padding[0] == padding[1] and padding[2] == padding[3] else None
    )


# ---------------------------------------------------------------- interpreter and CPU


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1))
def test_conv2d_ops_in_the_interpreter_match_the_loop_reference(seed):
    rng = _rng(seed)
    attrs, xs, ws = conv_case(rng)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    y = dq.ir.OPS["conv2d"].evaluate([x, w], attrs)
    np.testing.assert_allclose(y, ref_conv2d(x, w, **attrs), rtol=1e-10, atol=1e-10)


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["max", "avg"]))
def test_pools_in_the_interpreter_match_the_loop_reference(seed, kind):
    rng = _rng(seed)
    attrs, xs = pool_case(rng)
    x = rng.standard_normal(xs)
    got = dq.ir.OPS[f"{kind}Pool2d"].evaluate([x], attrs)
    np.testing.assert_allclose(
        got, ref_pool(x, attrs["kernel"], attrs["stride"], attrs["padding"], kind), rtol=1e-12
    )


def test_conv_and_pools_match_torch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = _rng(7)
    for _ in range(25):
        attrs, xs, ws = conv_case(rng)
        pad = _sym(attrs["padding"])
        if pad is None:
            continue
        x, w = rng.standard_normal(xs), rng.standard_normal(ws)
        want = F.conv2d(
            torch.tensor(x),
            torch.tensor(w),
            stride=attrs["stride"],
            padding=pad,
            dilation=attrs["dilation"],
            groups=attrs["groups"],
        ).numpy()
        got = dq.conv2d(
            x,
            w,
            stride=attrs["stride"],
            padding=pad,
            dilation=attrs["dilation"],
            groups=attrs["groups"],
        )
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
        pattrs, ps = pool_case(rng)
        x = rng.standard_normal(ps)
        k, s, p = pattrs["kernel"], pattrs["stride"], (pattrs["padding"][0], pattrs["padding"][2])
        np.testing.assert_allclose(
            dq.max_pool2d(x, k, s, p), F.max_pool2d(torch.tensor(x), k, s, p).numpy()
        )
        np.testing.assert_allclose(
            dq.avg_pool2d(x, k, s, p), F.avg_pool2d(torch.tensor(x), k, s, p).numpy(), rtol=1e-12
        )


@settings(max_examples=6)
@given(st.integers(0, 2**32 - 1))
def test_conv2d_and_pools_compiled_for_the_cpu_match_the_reference(seed):
    rng = _rng(seed)
    attrs, xs, ws = conv_case(rng, max_size=9)
    # the DSL takes symmetric padding: each side's larger pad (the window fits the drawn
    # padding, so it fits one at least as large; padding 0 instead could leave it too big)
    t, b, l, r = attrs["padding"]
    pad = (max(t, b), max(l, r))
    attrs = {**attrs, "padding": (pad[0], pad[0], pad[1], pad[1])}
    pattrs, _ = pool_case(rng)
    # the drawn pool window, shrunk to fit x (padding at most half the window, as torch)
    k = (min(pattrs["kernel"][0], xs[2]), min(pattrs["kernel"][1], xs[3]))
    s = pattrs["stride"]
    pp = (min(pattrs["padding"][0], k[0] // 2), min(pattrs["padding"][2], k[1] // 2))

    def f(x, w):
        y = dq.conv2d(
            x,
            w,
            stride=attrs["stride"],
            padding=pad,
            dilation=attrs["dilation"],
            groups=attrs["groups"],
        )
        return y, dq.avg_pool2d(x, k, s, pp), dq.max_pool2d(x, k, s, pp)

    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    y, a, m = dq.jit(f, target="cpu")(x, w)
    np.testing.assert_allclose(y, ref_conv2d(x, w, **attrs), rtol=1e-4, atol=1e-4)
    padding = (pp[0], pp[0], pp[1], pp[1])
    np.testing.assert_allclose(a, ref_pool(x, k, s, padding, "avg"), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m, ref_pool(x, k, s, padding, "max"), rtol=1e-6)


def test_a_larger_conv_goes_through_one_gemm_per_group_and_matches():
    rng = _rng(3)
    x = rng.standard_normal((8, 6, 17, 15)).astype(np.float32)
    w = rng.standard_normal((12, 3, 3, 3)).astype(np.float32)

    def f(x, w):
        return dq.conv2d(x, w, padding="same", groups=2)

    np.testing.assert_allclose(
        dq.jit(f, target="cpu")(x, w),
        ref_conv2d(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 2),
        rtol=1e-4,
        atol=1e-4,
    )


# ---------------------------------------------------------------- conv1d and padding="same"


def test_conv1d_is_conv2d_over_a_unit_height():
    rng = _rng(11)
    x, w = rng.standard_normal((2, 4, 13)), rng.standard_normal((6, 2, 4))
    got = dq.conv1d(x, w, stride=2, padding=3, dilation=2, groups=2)
    want = ref_conv2d(x[:, :, None], w[:, :, None], (1, 2), (0, 0, 3, 3), (1, 2), 2)[:, :, 0]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    ir = str(
        dq.make_ir(lambda x, w: dq.conv1d(x, w, padding=1))(
            x.astype(np.float32), w[:4, :].repeat(2, 1).astype(np.float32)
        )
    )
    assert "padShape" in ir and "squeezeShape" in ir and "conv2d" in ir  # views around one conv2d


def test_same_padding_puts_the_odd_pad_after_as_torch():
    rng = _rng(5)
    x, w = rng.standard_normal((1, 1, 6, 7)), rng.standard_normal((1, 1, 4, 2))
    got = dq.conv2d(x, w, padding="same", dilation=(1, 2))
    # dilated extents 4 and 3: pads (1 before, 2 after) and (1, 1)
    np.testing.assert_allclose(got, ref_conv2d(x, w, (1, 1), (1, 2, 1, 1), (1, 2), 1), rtol=1e-10)
    assert got.shape == x.shape
    np.testing.assert_allclose(
        dq.conv2d(x, w, padding="valid"), ref_conv2d(x, w, (1, 1), (0,) * 4, (1, 1), 1)
    )
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.conv2d(
        torch.tensor(x), torch.tensor(w), padding="same", dilation=(1, 2)
    )
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-10)


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("seed", range(4))
def test_grad_through_conv_and_pools_matches_central_differences(seed):
    rng = _rng(100 + seed)
    attrs, xs, ws = conv_case(rng)
    pad = _sym(attrs["padding"]) or 1

    def loss(x, w):
        y = dq.conv2d(
            x,
            w,
            stride=attrs["stride"],
            padding=pad,
            dilation=attrs["dilation"],
            groups=attrs["groups"],
        )
        y = dq.tanh(y)
        k = (min(2, y.shape[2]), min(2, y.shape[3]))
        return dq.sum(dq.max_pool2d(y, k, 1) * 1.5) + dq.sum(dq.avg_pool2d(y, k, 1, 0) ** 2)

    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    check_grads(loss, (x, w), order=1, rtol=1e-5)


def test_max_pool_gradient_goes_to_the_first_maximum_as_torch():
    x = np.array([[[[1.0, 3.0, 3.0], [3.0, 0.0, 2.0], [2.0, 3.0, 1.0]]]])
    g = dq.grad(lambda x: dq.sum(dq.max_pool2d(x, 2, 1)))(x)
    # 2x2 windows, taps in row-major order; ties go to the first: windows (0, 0) and (0, 1)
    # pick x[0, 1], window (1, 0) picks x[1, 0] over x[2, 1], window (1, 1) picks x[2, 1]
    want = np.zeros_like(x)
    want[0, 0, 0, 1], want[0, 0, 1, 0], want[0, 0, 2, 1] = 2.0, 1.0, 1.0
    np.testing.assert_array_equal(g, want)
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x, requires_grad=True)
    torch.nn.functional.max_pool2d(xt, 2, 1).sum().backward()
    np.testing.assert_array_equal(g, xt.grad.numpy())


# ---------------------------------------------------------------- a small CNN, compiled


def _cnn_loss(w1, b1, w2, wd, x, y):
    h = dq.relu(dq.conv2d(x, w1, padding=1) + b1)
    h = dq.max_pool2d(h, 2)
    h = dq.relu(dq.conv2d(h, w2))
    h = dq.avg_pool2d(h, 2, stride=1)
    h = dq.reshape(h, (x.shape[0], -1))
    return dq.mean(dq.softmax_cross_entropy(h @ wd, y))


def _cnn_args(rng, dtype):
    n = 3
    x = rng.standard_normal((n, 2, 8, 9))
    w1 = rng.standard_normal((4, 2, 3, 3)) * 0.4
    b1 = rng.standard_normal((1, 4, 1, 1)) * 0.1
    w2 = rng.standard_normal((5, 4, 2, 2)) * 0.4
    wd = rng.standard_normal((5 * 2 * 2, 7)) * 0.4
    y = np.eye(7)[rng.integers(0, 7, n)]
    return [a.astype(dtype) for a in (w1, b1, w2, wd, x, y)]


def test_cnn_value_and_grad_compiles_for_the_cpu_and_matches():
    rng = _rng(42)
    args32 = _cnn_args(rng, np.float32)
    step = dq.value_and_grad(_cnn_loss, argnums=(0, 1, 2, 3))
    v_cpu, g_cpu = dq.jit(step, target="cpu")(*args32)
    v_int, g_int = dq.jit(step, target="interp")(*args32)
    np.testing.assert_allclose(v_cpu, v_int, rtol=1e-5)
    for a, b in zip(g_cpu, g_int):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # float64 central differences for the gradients themselves
    args64 = [a.astype(np.float64) for a in args32]
    check_grads(_cnn_loss, args64, order=1, argnums=(0, 1, 2, 3), rtol=1e-5)
    # and the compiled f32 gradient against the float64 one
    g64 = dq.grad(_cnn_loss, argnums=(0, 1, 2, 3))(*args64)
    for a, b in zip(g_cpu, g64):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=1e-4)


# ---------------------------------------------------------------- IR syntax


def _module_of(fn) -> Module:
    m = Module("m")
    m.add(fn)
    return m


@pytest.mark.parametrize("op", WINDOW_OPS)
def test_every_window_op_round_trips_through_the_textual_ir(op):
    rng = _rng(hash(op) % 1000)
    for _ in range(5):
        fn, args = case_window(op, rng)
        text = print_module(_module_of(fn))
        assert op in text
        again = parse(text)
        assert print_module(again) == text
        np.testing.assert_array_equal(
            interpret(again, "f", *args), interpret(_module_of(fn), "f", *args)
        )


SRC = """module "m"
stage raw

func @f: (<1 x 2 x 5 x 5 x f32>, <4 x 1 x 3 x 3 x f32>) -> <1 x 4 x 1 x 1 x f32> {
'entry(%x: <1 x 2 x 5 x 5 x f32>, %w: <4 x 1 x 3 x 3 x f32>):
    %y = conv2d %x: <1 x 2 x 5 x 5 x f32>, %w: <4 x 1 x 3 x 3 x f32> stride [2, 2] padding [0, 1, 0, 1] dilation [1, 1] groups 2
    %p = avgPool2d %y: <1 x 4 x 2 x 2 x f32> kernel [2, 2] stride [1, 1] padding [0, 0]
    return %p: <1 x 4 x 1 x 1 x f32>
}
"""


def test_conv_syntax_parses_prints_and_computes():
    m = parse(SRC)
    assert print_module(m) == SRC
    rng = _rng(1)
    x, w = rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((4, 1, 3, 3))
    y = ref_conv2d(x, w, (2, 2), (0, 1, 0, 1), (1, 1), 2)
    np.testing.assert_allclose(
        interpret(m, "f", x, w, float64=True),
        ref_pool(y, (2, 2), (1, 1), (0,) * 4, "avg"),
        rtol=1e-12,
    )


@pytest.mark.parametrize(
    "old, new, column, words",
    [
        ("stride [2, 2]", "stride [2, 2, 2]", 70, "stride of conv2d takes 2 integers, got 3"),
        (
            "padding [0, 1, 0, 1]",
            "padding [0, 1, 0]",
            84,
            "padding of conv2d takes 2 (each side alike) or 4",
        ),
        ("groups 2", "groups [2]", 121, "groups of conv2d is one integer"),
        ("dilation [1, 1]", "dilations [1, 1]", 105, "conv2d has no attribute 'dilations'"),
        (
            "groups 2",
            "groups 2 stride [1, 1]",
            130,
            "attribute 'stride' of conv2d is written twice",
        ),
        (" groups 2", "", 10, "conv2d needs its attribute groups"),
        ("groups 2", "groups 3", 10, "input has 2 channels but the weights"),
        ("stride [2, 2]", "stride [0, 2]", 10, "stride [0, 2] must be positive"),
    ],
)
def test_bad_attributes_are_located_errors(old, new, column, words):
    text = SRC.replace(old, new, 1)
    with pytest.raises(SourceError) as err:
        parse(text, "bad.dl")
    msg = str(err.value)
    assert words in msg, msg
    assert f"bad.dl:6:{column}:" in msg, msg


def test_generic_ops_take_no_attributes():
    text = SRC.replace(
        "%p = avgPool2d %y: <1 x 4 x 2 x 2 x f32> kernel [2, 2] stride [1, 1] padding [0, 0]",
        "%p = exp %y: <1 x 4 x 2 x 2 x f32> stride [1, 1]",
    )
    with pytest.raises(SourceError, match="exp takes no attributes"):
        parse(text, "bad.dl")


# ---------------------------------------------------------------- DSL errors


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda x, w: dq.conv2d(x, w, stride=0), "conv2d: stride 0 must be positive"),
        (lambda x, w: dq.conv2d(x, w, stride=(1, 2, 3)), "stride must be an int or 2 ints"),
        (
            lambda x, w: dq.conv2d(x, w, padding="full"),
            "padding must be an int, 2 ints, 'same' or 'valid'",
        ),
        (lambda x, w: dq.conv2d(x, w, padding="same", stride=2), "padding='same' needs stride 1"),
        (lambda x, w: dq.conv2d(x, w, groups=3), "input has 2 channels but the weights"),
        (lambda x, w: dq.conv2d(x[0], w), "the input must be NCHW (rank 4)"),
        (lambda x, w: dq.conv2d(x, w, dilation=4), "does not fit the padded input"),
        (lambda x, w: dq.max_pool2d(x, 3, padding=2), "at most half the kernel"),
        (lambda x, w: dq.avg_pool2d(x, (2, 2.5)), "kernel must be an int or 2 ints"),
    ],
)
def test_bad_dsl_arguments_are_clear_errors_at_the_users_line(call, words):
    x = np.zeros((1, 2, 5, 5), np.float32)
    w = np.zeros((4, 1, 3, 3), np.float32)
    with pytest.raises(
        DlvmError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ) as err:
        dq.make_ir(lambda x, w: call(x, w))(x, w)
    assert "test_conv.py" in str(err.value)


def test_int_inputs_are_convolved_in_f32():
    x = np.arange(16, dtype=np.int32).reshape(1, 1, 4, 4)
    w = np.ones((1, 1, 2, 2), np.int32)
    ir = str(dq.make_ir(lambda x, w: dq.conv2d(x, w))(x, w))
    assert "dataTypeCast" in ir and "<1 x 1 x 3 x 3 x f32>" in ir


# ---------------------------------------------------------------- the GPU plan, emulated


def test_cnn_step_on_the_emulated_gpu_matches_the_cpu(monkeypatch, tmp_path):
    """The same plan on the gpu target (window steps through CuPy's array API, the kernels
    around them as PTX assembled by ptxas and emulated: tests/fake_cupy.py)."""
    import fake_cupy

    if fake_cupy.PTXAS is None:
        pytest.skip("ptxas is not installed")
    from dlvm_eq.codegen import set_cache_dir

    set_cache_dir(tmp_path)
    args = _cnn_args(_rng(8), np.float32)
    step = dq.value_and_grad(_cnn_loss, argnums=(0, 1, 2, 3))
    v_cpu, g_cpu = dq.jit(step, target="cpu")(*args)
    with fake_cupy.installed(monkeypatch, sms=2) as cp:
        v_gpu, g_gpu = dq.jit(step, target="gpu")(*[cp.asarray(a) for a in args])
        assert isinstance(v_gpu, fake_cupy.DeviceArray)
        np.testing.assert_allclose(v_gpu.get(), v_cpu, rtol=1e-5)
        for a, b in zip(g_gpu, g_cpu):
            assert isinstance(a, fake_cupy.DeviceArray)
            np.testing.assert_allclose(a.get(), b, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(
    not __import__("dlvm_eq.codegen", fromlist=["gpu_available"]).gpu_available(),
    reason="CUDA is not usable here",
)
def test_cnn_step_on_the_gpu_matches_the_cpu():
    import cupy as cp

    args = _cnn_args(_rng(9), np.float32)
    step = dq.value_and_grad(_cnn_loss, argnums=(0, 1, 2, 3))
    v_cpu, g_cpu = dq.jit(step, target="cpu")(*args)
    v_gpu, g_gpu = dq.jit(step, target="gpu")(*[cp.asarray(a) for a in args])
    np.testing.assert_allclose(cp.asnumpy(v_gpu), v_cpu, rtol=1e-5)
    for a, b in zip(g_gpu, g_cpu):
        assert isinstance(a, cp.ndarray)
        np.testing.assert_allclose(cp.asnumpy(a), b, rtol=1e-4, atol=1e-5)
