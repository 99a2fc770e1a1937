"""The generated convolution kernels (im2col, col2im; CPU and PTX) and the CPU convolution
built on them (runtime/conv_cpu.py), against window_ops' numpy algorithm and a float64
direct loop written out here; many threads on one compiled program; PTX through ptxas."""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.codegen.kernels.conv_spec import Col2imSpec, Im2colSpec, geometry
from dlvm_eq.codegen.kernels.spec import KernelError
from dlvm_eq.codegen.runtime import conv_cpu
from dlvm_eq.codegen.runtime.conv_kernel import compile_conv
from dlvm_eq.errors import DlvmError
from dlvm_eq.ir import window_ops
from dlvm_eq.ir.window_ops import out_size

PTXAS = shutil.which("ptxas")
DTYPES = {"f32": np.float32, "f64": np.float64}


def _np_matmul(a, b, out):
    np.matmul(a, b, out=out)


@st.composite
def conv_cases(draw):
    """(attrs, x shape, w shape, dtype): odd sizes, 1x1 kernels, size-1 dims, asymmetric
    padding, strides, dilations and groups; every window fits its padded input."""
    groups = draw(st.integers(1, 3))
    cg, og, n = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = tuple(draw(st.integers(0, 3)) for _ in range(4))
    fits = (
        out_size(h, kh, stride[0], padding[0], padding[1], dilation[0]) >= 1
        and out_size(w, kw, stride[1], padding[2], padding[3], dilation[1]) >= 1
    )
    if not fits:  # pad after the input until one window fits
        padding = (
            padding[0],
            padding[1] + dilation[0] * (kh - 1),
            padding[2],
            padding[3] + dilation[1] * (kw - 1),
        )
    attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    return (
        attrs,
        (n, groups * cg, h, w),
        (groups * og, cg, kh, kw),
        draw(st.sampled_from(["f32", "f64"])),
    )


def direct_reference(x, w, dy, attrs):
    """(y, dx, dw) in float64 by the definition: y[n, o, oh, ow] = sum over the group's input
    channels and taps of x[n, c, oh*sh - top + i*dh, ow*sw - left + j*dw] * w[o, c', i, j]
    (zero outside the input); dx and dw are the adjoints of that sum for seed dy."""
    x, w, dy = (np.asarray(a, np.float64) for a in (x, w, dy))
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw_), g = attrs["stride"], attrs["dilation"], attrs["groups"]
    top, _, left, _ = attrs["padding"]
    oh_n, ow_n = dy.shape[2:]
    y, dx, dwt = np.zeros(dy.shape), np.zeros(x.shape), np.zeros(w.shape)
    og = o // g
    for oc in range(o):
        for cl in range(cg):
            ci = (oc // og) * cg + cl
            for i in range(kh):
                for j in range(kw):
                    for oh in range(oh_n):
                        ih = oh * sh - top + i * dh
                        if not 0 <= ih < h:
                            continue
                        for ow in range(ow_n):
                            iw = ow * sw - left + j * dw_
                            if 0 <= iw < wd:
                                y[:, oc, oh, ow] += x[:, ci, ih, iw] * w[oc, cl, i, j]
                                dx[:, ci, ih, iw] += dy[:, oc, oh, ow] * w[oc, cl, i, j]
                                dwt[oc, cl, i, j] += dy[:, oc, oh, ow] @ x[:, ci, ih, iw]
    return y, dx, dwt


def _three(x, w, dy, attrs, **kw):
    h, wd = x.shape[2:]
    return (
        conv_cpu.evaluate("conv2d", [x, w], attrs, _np_matmul, **kw),
        conv_cpu.evaluate(
            "conv2dBackwardInput", [dy, w], dict(attrs, size=(h, wd)), _np_matmul, **kw
        ),
        conv_cpu.evaluate(
            "conv2dBackwardWeight", [x, dy], dict(attrs, size=w.shape[2:]), _np_matmul, **kw
        ),
    )


@settings(max_examples=40)
@given(conv_cases(), st.booleans(), st.sampled_from([None, 1, 3000]))
def test_cpu_convolutions_match_the_numpy_algorithm_and_the_direct_loop(case, small, chunk_bytes):
    """Both product strategies, one chunk or many (chunk_bytes 1: an image a chunk; 3000: a
    partial last chunk for most shapes), all three ops."""
    attrs, xs, ws, dt = case
    rng = np.random.default_rng(abs(hash((xs, ws))) % 2**32)
    x, w = rng.standard_normal(xs).astype(DTYPES[dt]), rng.standard_normal(ws).astype(DTYPES[dt])
    y_np = window_ops.conv2d(np, x, w, attrs)
    dy = rng.standard_normal(y_np.shape).astype(DTYPES[dt])
    got = _three(x, w, dy, attrs, small=small, chunk_bytes=chunk_bytes)
    want_np = (
        y_np,
        window_ops.conv2d_backward_input(np, dy, w, dict(attrs, size=xs[2:])),
        window_ops.conv2d_backward_weight(np, x, dy, dict(attrs, size=ws[2:])),
    )
    tol = 2e-5 if dt == "f32" else 1e-12
    for g, a, b in zip(got, want_np, direct_reference(x, w, dy, attrs)):
        assert g.dtype == DTYPES[dt] and g.shape == b.shape
        np.testing.assert_allclose(g, a, rtol=tol, atol=tol * 4)
        np.testing.assert_allclose(g.astype(np.float64), b, rtol=tol * 10, atol=tol * 40)


def _guarded(n: int, dtype, guard: int = 64):
    """A buffer of n elements with NaN guards on both sides: a write out of bounds shows."""
    raw = np.full(n + 2 * guard, np.nan, dtype)
    return raw, raw[guard : guard + n]


@settings(max_examples=30)
@given(conv_cases(), st.booleans())
def test_im2col_writes_every_window_element_in_both_layouts_and_nothing_else(case, long_layout):
    attrs, xs, ws, dt = case
    x = np.random.default_rng(1).standard_normal(xs).astype(DTYPES[dt])
    g = geometry(dt, xs, ws[2:], attrs)
    n, r, p = xs[0], g.rows, g.cols
    want = window_ops.windows(
        np, window_ops.padded(np, x, attrs["padding"]), g.kernel, g.stride, g.dilation, g.out_hw
    ).reshape(n, r, p)
    raw, cols = _guarded(n * r * p, DTYPES[dt])
    if long_layout:  # (R, n*P): row r holds the images side by side
        compile_conv(Im2colSpec(g)).run(cols, x, n, p, n * p)
        got = cols.reshape(r, n, p).transpose(1, 0, 2)
    else:  # (n, R, P): one matrix per image
        compile_conv(Im2colSpec(g)).run(cols, x, n, r * p, p)
        got = cols.reshape(n, r, p)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(raw[:64]).all() and np.isnan(raw[-64:]).all()


@settings(max_examples=30)
@given(conv_cases())
def test_col2im_sums_every_window_element_back_like_the_reference(case):
    attrs, xs, ws, dt = case
    g = geometry(dt, xs, ws[2:], attrs)
    n, r, p = xs[0], g.rows, g.cols
    cols = np.random.default_rng(2).standard_normal((n, r, p)).astype(DTYPES[dt])
    t, b, l, rr = attrs["padding"]
    full = window_ops.col2im(
        np,
        cols.reshape((n, g.channels) + g.kernel + g.out_hw),
        (g.height + t + b, g.width + l + rr),
        g.stride,
        g.dilation,
    )
    want = full[:, :, t : t + g.height, l : l + g.width]
    raw, dx = _guarded(n * g.channels * g.plane, DTYPES[dt])
    compile_conv(Col2imSpec(g)).run(dx, cols, n, r * p, p)
    np.testing.assert_array_equal(dx.reshape(xs), want)  # same sums in the same order
    assert np.isnan(raw[:64]).all() and np.isnan(raw[-64:]).all()


def test_col2im_items_are_channel_major_planes():
    """Items [0, images) are channel 0 of every image (item c*images + n -> plane n*C + c):
    the planes of one channel read neighbouring segments of the same column rows."""
    g = geometry(
        "f64", (3, 2, 4, 5), (2, 3), {"stride": (1, 2), "padding": (1, 0, 2, 1), "dilation": (1, 1)}
    )
    n, r, p = 3, g.rows, g.cols
    cols = np.random.default_rng(3).standard_normal((r, n * p))
    k = compile_conv(Col2imSpec(g))
    dx = np.full((n, g.channels, g.height, g.width), np.nan)
    dims = np.array([p, n * p, n], np.int64)
    k.fn(0, n, dx.ctypes.data, cols.ctypes.data, dims.ctypes.data)
    full = np.empty_like(dx)
    k.run(full, cols, n, p, n * p)
    np.testing.assert_array_equal(dx[:, 0], full[:, 0])
    assert np.isnan(dx[:, 1:]).all()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="checks x86 assembly")
def test_col2im_has_no_masked_vector_stores():
    """The taps are unrolled with constant row and column ranges: with run-time trip counts
    LLVM vectorized the sums with masked AVX loads and stores (vmaskmov), slow on Zen and
    defeating store forwarding between taps."""
    from dlvm_eq.codegen.cpu.im2col_ir import conv_ir
    from dlvm_eq.codegen.cpu.llvm_cpu import assembly, family_pipeline

    g = geometry(
        "f32",
        (128, 32, 14, 14),
        (3, 3),
        {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1)},
    )
    speed, vectorize = family_pipeline("col2im")  # the pipeline its kernels are built with
    asm = assembly(conv_ir(Col2imSpec(g)).text, vectorize, speed)
    assert "vaddps" in asm and "vmaskmov" not in asm


@pytest.mark.parametrize("spec_type", [Im2colSpec, Col2imSpec])
def test_window_kernels_are_built_with_their_familys_pipeline(spec_type):
    """The object code a conv kernel runs is its family's LLVM pipeline's (FAMILY_PIPELINE),
    byte for byte, whether built now or read from the disk cache (keyed by the source)."""
    from dlvm_eq.codegen.cpu import llvm_cpu
    from dlvm_eq.codegen.cpu.im2col_ir import conv_ir
    from dlvm_eq.codegen.runtime.jit import JIT

    g = geometry(
        "f32", (3, 5, 9, 7), (3, 2), {"stride": (2, 1), "padding": (1, 0, 1, 1), "dilation": (1, 1)}
    )
    spec = spec_type(g)
    kernel = compile_conv(spec)
    kir = conv_ir(spec)
    speed, vectorize = llvm_cpu.family_pipeline(kir.kind)
    assert (kir.kind, speed) == (spec.name, 2)
    symbol = next(
        s for s, a in JIT.symbols.items() if a == ctypes.cast(kernel.fn, ctypes.c_void_p).value
    )
    assert JIT.objects[symbol] == llvm_cpu.compile_object(kir.text, vectorize, speed)


def test_a_too_small_buffer_is_a_clear_error_not_a_write_out_of_bounds():
    g = geometry(
        "f32", (2, 3, 5, 5), (3, 3), {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1)}
    )
    x = np.zeros((2, 3, 5, 5), np.float32)
    with pytest.raises(KernelError, match="at least 1350 elements") as e:
        compile_conv(Im2colSpec(g)).run(np.zeros(1349, np.float32), x, 2, g.rows * g.cols, g.cols)
    assert isinstance(e.value, DlvmError)
    with pytest.raises(KernelError, match="float32"):
        compile_conv(Im2colSpec(g)).run(np.zeros(1350, np.float64), x, 2, g.rows * g.cols, g.cols)


def test_the_rule_takes_per_image_products_only_where_they_are_small():
    pad1 = {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1)}
    first = geometry("f32", (128, 1, 28, 28), (3, 3), pad1)  # 32x9 @ 9x784 per image
    second = geometry("f32", (128, 32, 14, 14), (3, 3), pad1)  # 64x288 @ 288x196 per image
    assert conv_cpu.per_image(first, 32, 1) and not conv_cpu.per_image(second, 64, 1)
    assert conv_cpu.per_image(second, 64, 32)  # 2x9 @ 9x196 per group
    assert (
        conv_cpu.chunk_images(second, 128) == 128
        and conv_cpu.chunk_images(second, 128, 1 << 20) == 4
    )


@pytest.mark.parametrize("small", [True, False])
def test_products_and_copies_run_in_blocks_on_many_threads_with_the_same_bits(monkeypatch, small):
    """The per-image products (too small for OpenBLAS to thread) and the transposing copies
    of the long strategy run in blocks over the usable CPUs; the bits do not depend on the
    CPU count."""
    attrs = {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1}
    rng = np.random.default_rng(4)
    x, w = (
        rng.standard_normal((9, 2, 6, 5)).astype(np.float32),
        rng.standard_normal((4, 2, 3, 3)).astype(np.float32),
    )
    dy = rng.standard_normal((9, 4, 6, 5)).astype(np.float32)
    monkeypatch.setattr(conv_cpu, "BLOCK_MACS", 1)  # blocks however small the work
    monkeypatch.setattr(conv_cpu, "BLOCK_BYTES", 1)
    real = conv_cpu.run_python
    results, blocks = {}, {}
    for cpus in (1, 3):
        monkeypatch.setattr(conv_cpu, "usable_cpus", lambda cpus=cpus: cpus)
        monkeypatch.setattr(
            conv_cpu,
            "run_python",
            lambda fn, chunks, t, cpus=cpus: (
                blocks.setdefault(cpus, []).append(len(chunks)) or real(fn, chunks, t)
            ),
        )
        results[cpus] = _three(x, w, dy, attrs, small=small)
    assert blocks[1][0] == 3 and blocks[3][0] == 9  # 9 images: min(9, 4 per CPU) blocks
    for one, many in zip(results[1], results[3]):
        np.testing.assert_array_equal(one, many)


def _in_fresh_thread(fn):
    """fn() on a new thread: one with no kept column matrix (conv_reuse is per thread)."""
    got = []
    t = threading.Thread(target=lambda: got.append(fn()))
    t.start()
    t.join(timeout=60)
    return got[0]


def test_the_weight_adjoint_reuses_the_forwards_column_matrix_only_for_the_same_bits(monkeypatch):
    from dlvm_eq.codegen.runtime import conv_reuse

    monkeypatch.setattr(
        conv_reuse._local, "kept", {}, raising=False
    )  # what earlier tests kept aside
    attrs = {"stride": (2, 1), "padding": (1, 0, 2, 1), "dilation": (1, 2), "groups": 2}
    rng = np.random.default_rng(8)
    x, w = (
        rng.standard_normal((3, 4, 7, 6)).astype(np.float32),
        rng.standard_normal((6, 2, 3, 2)).astype(np.float32),
    )
    y = conv_cpu.evaluate("conv2d", [x, w], attrs, _np_matmul, small=False)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    hits = []
    real = conv_reuse.kept_matrix
    monkeypatch.setattr(
        conv_reuse, "kept_matrix", lambda *a: hits.append(real(*a) is not None) or real(*a)
    )

    def weight(x):
        return conv_cpu.evaluate(
            "conv2dBackwardWeight", [x, dy], dict(attrs, size=(3, 2)), _np_matmul, small=False
        )

    reused = weight(x)
    np.testing.assert_array_equal(reused, _in_fresh_thread(lambda: weight(x)))
    assert hits == [True, False]
    x[1, 2, 3, 4] = np.float32(0.5) + x[1, 2, 3, 4]  # the same buffer, other bits: recomputed
    np.testing.assert_array_equal(weight(x), _in_fresh_thread(lambda: weight(x)))
    assert hits[2:] == [False, False]
    zeros = np.zeros_like(x)  # -0.0 is not 0.0: the bits decide
    conv_cpu.evaluate("conv2d", [zeros, w], attrs, _np_matmul, small=False)
    (kept,) = conv_reuse._local.kept.values()
    assert real(-zeros, kept.geometry) is None and real(zeros.copy(), kept.geometry) is not None
    other = dict(attrs, stride=(1, 1))  # another geometry's forward keeps its own
    conv_cpu.evaluate("conv2d", [zeros, w], other, _np_matmul, small=False)
    assert len(conv_reuse._local.kept) == 2
    weight(zeros)  # and this one's is still there
    assert hits[-1] is True
    conv_cpu.evaluate(
        "conv2d", [x, w], attrs, _np_matmul, small=False
    )  # same shape, other x: replaced
    weight(zeros)
    assert hits[-1] is False


def _cnn_loss(x, w1, w2):
    h = dq.relu(dq.conv2d(x, w1, stride=(2, 1), padding=1))
    return dq.sum(dq.conv2d(h, w2, padding=(0, 2), dilation=(1, 2), groups=2) ** 2)


def test_many_threads_calling_one_compiled_program_match_the_interpreter():
    rng = np.random.default_rng(5)
    step = dq.value_and_grad(_cnn_loss, argnums=(0, 1, 2))
    cpu, interp = dq.jit(step, target="cpu"), dq.jit(step, target="interp")
    cases = [
        [
            rng.standard_normal(s).astype(np.float32)
            for s in ((3, 2, 9, 7), (4, 2, 3, 3), (6, 2, 1, 3))
        ]
        for _ in range(4)
    ]
    wants = [interp(*a) for a in cases]
    errors = []

    def work(t):
        try:
            for k in range(6):
                i = (t + k) % len(cases)
                v, grads = cpu(*cases[i])
                np.testing.assert_allclose(v, wants[i][0], rtol=1e-4)
                for g, w in zip(grads, wants[i][1]):
                    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-3)
        except Exception as e:
            errors.append((t, e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]


def test_the_compiled_conv_step_runs_the_generated_kernels(monkeypatch):
    calls = []
    real = conv_cpu.evaluate
    monkeypatch.setattr(
        conv_cpu, "evaluate", lambda op, *a, **k: calls.append(op) or real(op, *a, **k)
    )
    rng = np.random.default_rng(6)
    args = [
        rng.standard_normal(s).astype(np.float32)
        for s in ((2, 2, 8, 8), (3, 2, 3, 3), (4, 3, 2, 2))
    ]
    dq.jit(dq.value_and_grad(_cnn_loss_plain, argnums=(0, 1, 2)), target="cpu")(*args)
    assert {"conv2d", "conv2dBackwardInput", "conv2dBackwardWeight"} <= set(calls)


def _cnn_loss_plain(x, w1, w2):
    return dq.sum(dq.conv2d(dq.relu(dq.conv2d(x, w1, padding=1)), w2) ** 2)


# ---------------------------------------------------------------- the GPU kernels

GPU_GEOMETRIES = [
    ("f32", (3, 2, 9, 8), (3, 2), {"stride": (2, 3), "padding": (0, 2, 1, 3), "dilation": (2, 1)}),
    ("f64", (2, 3, 5, 4), (1, 1), {"stride": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1)}),
    ("f32", (1, 1, 1, 1), (3, 3), {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1)}),
]


@pytest.mark.skipif(PTXAS is None, reason="ptxas is not on PATH")
@pytest.mark.parametrize("case", range(len(GPU_GEOMETRIES)))
@pytest.mark.parametrize("kind", [Im2colSpec, Col2imSpec])
def test_conv_ptx_assembles_for_sm_90(case, kind, tmp_path):
    from dlvm_eq.codegen.gpu.im2col_ptx import conv_ptx

    dt, xs, k, attrs = GPU_GEOMETRIES[case]
    kp = conv_ptx(kind(geometry(dt, xs, k, attrs)), arch="sm_90")
    assert f".entry {kp.symbol}" in kp.ptx
    (tmp_path / "k.ptx").write_text(kp.ptx)
    r = subprocess.run(
        [PTXAS, "-arch=sm_90", str(tmp_path / "k.ptx"), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("case", range(len(GPU_GEOMETRIES)))
def test_the_gpu_kernels_logic_matches_the_reference_when_emulated_on_the_cpu(case):
    """Every (block, thread) of a 2-block x 3-thread grid run in turn: the grid-stride loop
    covers each item once."""
    from dlvm_eq.codegen.cpu.llvm_cpu import CpuIR
    from dlvm_eq.codegen.gpu.im2col_ptx import conv_host_emulation_ir
    from dlvm_eq.codegen.runtime.jit import JIT

    dt, xs, k, attrs = GPU_GEOMETRIES[case]
    g = geometry(dt, xs, k, attrs)
    n, r, p = xs[0], g.rows, g.cols
    x = np.random.default_rng(7).standard_normal(xs).astype(DTYPES[dt])
    cols = np.full((n, r, p), np.nan, DTYPES[dt])
    dx = np.full(xs, np.nan, DTYPES[dt])
    for spec, dst, src, items in (
        (Im2colSpec(g), cols, x, n * r),
        (Col2imSpec(g), dx, cols, n * g.channels),
    ):
        text, symbol = conv_host_emulation_ir(spec)
        fn = ctypes.CFUNCTYPE(
            None,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
            *[ctypes.c_int64] * 3,
            *[ctypes.c_int32] * 6,
        )(JIT.address(CpuIR(text, symbol, None, "emulated")))
        for block in range(2):
            for thread in range(3):
                fn(items, dst.ctypes.data, src.ctypes.data, r * p, p, n, block, 3, thread, 2, 0, 1)
    want = window_ops.windows(
        np, window_ops.padded(np, x, attrs["padding"]), g.kernel, g.stride, g.dilation, g.out_hw
    ).reshape(n, r, p)
    np.testing.assert_array_equal(cols, want)
    t, b, l, rr = attrs["padding"]
    full = window_ops.col2im(
        np,
        want.reshape((n, g.channels) + g.kernel + g.out_hw),
        (g.height + t + b, g.width + l + rr),
        g.stride,
        g.dilation,
    )
    np.testing.assert_array_equal(dx, full[:, :, t : t + g.height, l : l + g.width])


def test_conv_kernels_build_with_the_plan_not_on_the_first_call():
    # their build time then counts in the compile's `kernels` phase (the report's breakdown)
    from dlvm_eq.codegen.runtime import conv_kernel
    from dlvm_eq.codegen.runtime.jit import JIT

    rng = np.random.default_rng(7)
    args = [
        rng.standard_normal(s).astype(np.float32)
        for s in ((3, 2, 9, 7), (4, 2, 3, 3), (6, 2, 1, 3))
    ]
    step = dq.value_and_grad(_cnn_loss, argnums=(0, 1, 2))
    module = dq.jit(step).lower(*args)
    name = next(iter(module.functions))
    compiled = dq.compile(module, name)
    built = set(conv_kernel._kernels)
    kinds = {type(k[0] if isinstance(k, tuple) else k).__name__ for k in built}
    assert {"Im2colSpec", "Col2imSpec"} <= kinds
    counters = dict(JIT.counters)
    got = compiled(*args)  # the value and the three gradients, flat
    assert set(conv_kernel._kernels) == built  # the call built no window kernel
    assert {k: JIT.counters[k] for k in ("compiled", "loaded_from_disk")} == {
        k: counters[k] for k in ("compiled", "loaded_from_disk")
    }
    assert "kernels" in compiled.report.phases
    want_value, want_grads = dq.jit(step, target="interp")(*args)
    assert len(got) == 4
    for g, w in zip(got, [want_value, *want_grads]):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())
