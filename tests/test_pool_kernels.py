"""The compiled pooling kernels (kernels/pool_spec.py, cpu/pool_ir.py, runtime/pool_kernel.py,
gpu/pool_ptx.py) against window_ops' numpy algorithm and a float64 loop written out by hand:
drawn shapes (odd sizes, 1x1 kernels, stride below and above the kernel, padding, size-1
dims, f32 and f64), ties and NaNs, programs called from many threads, PTX through ptxas."""

from __future__ import annotations

import math
import shutil
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.codegen.kernels.pool_spec import pool_spec
from dlvm_eq.codegen.runtime import pool_kernel
from dlvm_eq.codegen.runtime.pool_kernel import compile_pool
from dlvm_eq.ir import window_ops

NP = {"f32": np.float32, "f64": np.float64}


def loop_reference(op, args, kernel, stride, padding, hw):
    """op by loops over every window and tap, in float64 (the semantics of window_ops, spelled
    out: -inf padding and the first maximum in row-major tap order for max pools, NaN counting
    as the maximum; the whole window as divisor for avg pools)."""
    (kh, kw), (sh, sw), (t, b, l, r) = kernel, stride, padding
    h, w = hw
    oh, ow = (h + t + b - kh) // sh + 1, (w + l + r - kw) // sw + 1
    first = np.asarray(args[0], np.float64)
    n, c = first.shape[:2]
    fwd = op in ("maxPool2d", "maxPool2dGather", "avgPool2d")
    out = np.zeros((n, c, oh, ow) if fwd else (n, c, h, w))
    for q in np.ndindex(n, c):
        for oy in range(oh):
            for ox in range(ow):
                taps = [(oy * sh + i - t, ox * sw + j - l) for i in range(kh) for j in range(kw)]
                real = [0 <= iy < h and 0 <= ix < w for iy, ix in taps]
                if op.startswith("avg"):
                    if op == "avgPool2d":
                        out[q + (oy, ox)] = sum(first[q + p] for p, ok in zip(taps, real) if ok) / (
                            kh * kw
                        )
                    else:
                        for p, ok in zip(taps, real):
                            if ok:
                                out[q + p] += first[q + (oy, ox)] / (kh * kw)
                    continue
                vals = [first[q + p] if ok else -math.inf for p, ok in zip(taps, real)]
                best = 0
                for k, v in enumerate(vals):
                    if v > vals[best] or (math.isnan(v) and not math.isnan(vals[best])):
                        best = k
                p, ok = taps[best], real[best]
                if op == "maxPool2d":
                    out[q + (oy, ox)] = vals[best]
                elif op == "maxPool2dGather":
                    out[q + (oy, ox)] = float(args[1][q + p]) if ok else 0.0
                elif ok:
                    out[q + p] += float(args[1][q + (oy, ox)])
    return out


@st.composite
def cases(draw):
    op = draw(st.sampled_from(window_ops.POOL_OPS))
    dt = draw(st.sampled_from(["f32", "f64"]))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    cap_h, cap_w = (
        (kh // 2, kw // 2) if op.startswith("max") else (kh - 1, kw - 1)
    )  # max: torch's limit
    pad = (
        draw(st.integers(0, cap_h)),
        draw(st.integers(0, cap_h)),
        draw(st.integers(0, cap_w)),
        draw(st.integers(0, cap_w)),
    )
    h = draw(st.integers(max(1, kh - pad[0] - pad[1]), 12))
    w = draw(st.integers(max(1, kw - pad[2] - pad[3]), 40))  # up to 2 vector blocks of windows
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    return op, dt, (kh, kw), (sh, sw), pad, (n, c, h, w), seed


def _operands(op, dt, shape, attrs, rng, values=None):
    n, c, h, w = shape
    spec = pool_spec(op, attrs, (h, w), dt)
    oh, ow = spec.out_hw
    draw = values or (lambda s: rng.standard_normal(s))
    x = draw(shape).astype(NP[dt])
    small = rng.standard_normal((n, c, oh, ow)).astype(NP[dt])
    args = {
        "maxPool2d": [x],
        "avgPool2d": [x],
        "maxPool2dGather": [x, rng.standard_normal(shape).astype(NP[dt])],
        "maxPool2dBackward": [x, small],
        "avgPool2dBackward": [small],
    }[op]
    out_shape = shape if spec.writes_input_plane else (n, c, oh, ow)
    return spec, args, out_shape


def _run(spec, args, out_shape):
    out = np.full(out_shape, np.nan, NP[spec.dtype])  # NaN: a position the kernel skipped shows
    compile_pool(spec).run(out, args)
    return out


def _check(op, dt, kernel, stride, pad, shape, rng, values=None):
    attrs = {"kernel": kernel, "stride": stride, "padding": pad}
    if op == "avgPool2dBackward":
        attrs["size"] = shape[2:]
    spec, args, out_shape = _operands(op, dt, shape, attrs, rng, values)
    got = _run(spec, args, out_shape)
    want = window_ops.evaluate(op, np, args, attrs)
    by_hand = loop_reference(op, args, kernel, stride, pad, shape[2:])
    accumulates = op.startswith("avg") or (op == "maxPool2dBackward" and spec.overlapping)
    if accumulates:  # sums in another order than numpy's: rounding differs
        tol = dict(rtol=2e-6, atol=2e-6) if dt == "f32" else dict(rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(got, want, **tol)
    else:  # a max or a routed value: bit for bit
        np.testing.assert_array_equal(got, want)
    tol = dict(rtol=2e-6, atol=2e-6) if dt == "f32" else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, by_hand, **tol)
    return spec, got


@settings(max_examples=80)
@given(cases())
def test_pool_kernels_match_window_ops_and_a_float64_loop(case):
    op, dt, kernel, stride, pad, shape, seed = case
    _check(op, dt, kernel, stride, pad, shape, np.random.default_rng(seed))


@pytest.mark.parametrize("op", window_ops.POOL_OPS)
@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize(
    "kernel,stride,pad,shape",
    [
        (
            (2, 2),
            (2, 2),
            (0, 0, 0, 0),
            (3, 5, 28, 28),
        ),  # the CNN's pools: vector blocks, overlapping tail
        ((2, 2), (2, 2), (0, 0, 0, 0), (2, 3, 14, 14)),
        (
            (3, 3),
            (2, 2),
            (1, 1, 1, 1),
            (2, 2, 9, 11),
        ),  # overlapping and padded (ResNet's stem pool)
        ((3, 3), (3, 3), (0, 0, 0, 0), (1, 2, 10, 50)),  # a 3-wide tile: deinterleaving by 3
        ((1, 1), (1, 1), (0, 0, 0, 0), (1, 1, 1, 1)),
        ((2, 1), (3, 4), (1, 1, 0, 0), (2, 1, 7, 9)),  # stride above the kernel: gaps zeroed
    ],
)
def test_pool_kernels_on_fixed_shapes(op, dt, kernel, stride, pad, shape):
    _check(op, dt, kernel, stride, pad, shape, np.random.default_rng(7))


@pytest.mark.parametrize("op", ["maxPool2d", "maxPool2dGather", "maxPool2dBackward"])
@pytest.mark.parametrize(
    "kernel,stride,pad",
    [
        ((2, 2), (2, 2), (0, 0, 0, 0)),
        ((3, 3), (1, 1), (1, 1, 1, 1)),
        ((3, 2), (2, 2), (1, 1, 1, 0)),
    ],
)
def test_ties_route_to_the_first_maximum_in_window_order(op, kernel, stride, pad):
    """Constant inputs (every tap ties), -inf beside -inf padding, and NaNs: the first maximum
    in row-major tap order wins, as numpy's argmax decides."""
    rng = np.random.default_rng(3)
    _check(op, "f32", kernel, stride, pad, (2, 3, 9, 20), rng, values=lambda s: np.full(s, 1.5))
    spec, got = _check(
        op,
        "f64",
        kernel,
        stride,
        pad,
        (1, 2, 8, 19),
        rng,
        values=lambda s: np.where(rng.random(s) < 0.5, -np.inf, rng.integers(0, 2, s) * 1.0),
    )

    def with_nans(s):
        a = rng.integers(0, 3, s).astype(np.float64)
        a[rng.random(s) < 0.2] = np.nan
        return a

    _check(op, "f32", kernel, stride, pad, (2, 2, 7, 33), rng, values=with_nans)


def test_ties_pick_the_first_tap_when_written_out():
    """A 2x2 window of equal values: the gradient goes to its top-left position only."""
    x = np.ones((1, 1, 2, 2), np.float32)
    spec = pool_spec(
        "maxPool2dBackward",
        {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0, 0, 0)},
        (2, 2),
        "f32",
    )
    dx = _run(spec, [x, np.full((1, 1, 1, 1), 5.0, np.float32)], x.shape)
    np.testing.assert_array_equal(dx[0, 0], [[5.0, 0.0], [0.0, 0.0]])


def test_a_compiled_cnn_step_runs_its_pools_on_the_kernels_from_many_threads():
    """value_and_grad of a pooled network compiled for the CPU: its maxPool2d and
    maxPool2dBackward steps run on compiled pool kernels, and 8 threads calling the program at
    once all get the interpreter's results."""
    rng = np.random.default_rng(5)

    def loss(x, v):
        return dq.sum(dq.max_pool2d(x, 2, 2) * v) + dq.sum(dq.avg_pool2d(x, 3, 2, 1))

    x = rng.standard_normal((4, 3, 13, 12)).astype(np.float32)
    v = rng.standard_normal((4, 3, 6, 6)).astype(np.float32)
    before = set(pool_kernel._kernels)
    step = dq.jit(dq.value_and_grad(loss), target="cpu")
    want = dq.jit(dq.value_and_grad(loss), target="interp")(x, v)
    step(x, v)
    used = {s.op for s in set(pool_kernel._kernels) - before} | {s.op for s in before}
    assert {"maxPool2d", "maxPool2dBackward", "avgPool2d", "avgPool2dBackward"} <= used
    results, errors = [None] * 8, []

    def call(i):
        try:
            for _ in range(5):
                results[i] = step(x, v)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for value, grad in results:
        np.testing.assert_allclose(value, want[0], rtol=1e-5)
        np.testing.assert_allclose(grad, want[1], rtol=1e-5, atol=1e-6)


def test_specs_that_get_no_kernel_say_why():
    attrs = {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0, 0, 0)}
    with pytest.raises(dq.DlvmError, match="f32 or f64"):
        pool_spec("maxPool2d", attrs, (4, 4), "i32")
    with pytest.raises(dq.DlvmError, match="too large"):
        pool_spec("maxPool2d", attrs, (2, 2 * (1 << 15)), "f32")


# ------------------------------------------------------------------ the GPU kernels (PTX)

GPU_CASES = [
    ("maxPool2d", (3, 3), (2, 2), (1, 1, 1, 1), (2, 3, 7, 9)),
    ("maxPool2dGather", (2, 3), (3, 1), (1, 0, 1, 1), (1, 2, 5, 7)),
    ("maxPool2dBackward", (3, 3), (2, 2), (1, 1, 1, 1), (2, 2, 7, 9)),  # overlapping
    ("maxPool2dBackward", (2, 2), (2, 2), (0, 0, 0, 0), (2, 3, 8, 9)),
    ("avgPool2d", (3, 2), (1, 2), (1, 1, 1, 0), (1, 3, 6, 5)),
    ("avgPool2dBackward", (3, 3), (2, 1), (1, 1, 1, 1), (2, 1, 7, 4)),
    ("avgPool2dBackward", (1, 1), (1, 1), (0, 0, 0, 0), (1, 1, 1, 1)),
]


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")
@pytest.mark.parametrize("op,kernel,stride,pad,shape", GPU_CASES)
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_pool_ptx_assembles_for_sm_90_and_its_logic_matches_when_emulated(
    op, kernel, stride, pad, shape, dt, tmp_path
):
    """The PTX of each pooling op goes through ptxas; the same kernel's IR built for the host
    (special registers as arguments), run as one thread whose grid-stride loop covers every
    item, matches window_ops."""
    import ctypes
    import subprocess

    from dlvm_eq.codegen.cpu.llvm_cpu import CpuIR
    from dlvm_eq.codegen.gpu.llvm_ptx import compile_ptx
    from dlvm_eq.codegen.gpu.pool_ptx import items, pool_host_emulation_ir, pool_ptx_ir
    from dlvm_eq.codegen.runtime.jit import JIT

    attrs = {"kernel": kernel, "stride": stride, "padding": pad}
    if op == "avgPool2dBackward":
        attrs["size"] = shape[2:]
    rng = np.random.default_rng(11)
    spec, args, out_shape = _operands(op, dt, shape, attrs, rng)
    src = tmp_path / "k.ptx"
    src.write_text(compile_ptx(pool_ptx_ir(spec, "sm_90")[0], "sm_90"))
    r = subprocess.run(
        ["ptxas", "-arch=sm_90", str(src), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    text, symbol = pool_host_emulation_ir(spec)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_int64, *[ctypes.c_void_p] * 3, *[ctypes.c_int32] * 6)(
        JIT.address(CpuIR(text, symbol, None, "emulated"))
    )
    got = np.full(out_shape, np.nan, NP[dt])
    ptrs = [got.ctypes.data] + [a.ctypes.data for a in args]
    ptrs += ptrs[-1:] * (3 - len(ptrs))
    fn(items(spec, shape[0] * shape[1]), *ptrs, 0, 1, 0, 1, 0, 1)  # one thread of one block
    want = window_ops.evaluate(op, np, args, attrs)
    np.testing.assert_allclose(
        got, want, rtol=2e-6 if dt == "f32" else 1e-13, atol=1e-6 if dt == "f32" else 1e-13
    )


def _pooled_loss(x, v):
    return dq.sum(dq.max_pool2d(x, 2, 2) * v) + dq.sum(dq.avg_pool2d(x, 3, 2, 1))


def test_the_gpu_program_runs_its_pools_on_the_pool_kernels(monkeypatch):
    """On the gpu target (emulated: tests/fake_cupy.py) the pooling steps launch the PTX pool
    kernels, and the step's value and gradient are the CPU's."""
    import fake_cupy

    if fake_cupy.PTXAS is None:
        pytest.skip("ptxas is not installed")
    from dlvm_eq.codegen.gpu import gpu_runtime
    from dlvm_eq.codegen.kernels.pool_spec import PoolSpec

    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 2, 6, 5)).astype(np.float32)
    v = rng.standard_normal((1, 2, 3, 2)).astype(np.float32)
    step = dq.value_and_grad(_pooled_loss)
    want = dq.jit(step, target="cpu")(x, v)
    with fake_cupy.installed(monkeypatch, sms=1) as cp:
        value, grad = dq.jit(step, target="gpu")(cp.asarray(x), cp.asarray(v))
    launched = {spec.op for spec, _ in gpu_runtime._ptx_cache if isinstance(spec, PoolSpec)}
    assert {"maxPool2d", "maxPool2dBackward", "avgPool2d", "avgPool2dBackward"} <= launched
    np.testing.assert_allclose(value.get(), want[0], rtol=1e-5)
    np.testing.assert_allclose(grad.get(), want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_pool_kernels_on_a_gpu_match_the_cpu():
    from dlvm_eq.codegen.gpu.gpu_runtime import cupy_module, gpu_available

    if not gpu_available():
        pytest.skip("no usable CUDA device")
    cp = cupy_module()
    rng = np.random.default_rng(12)
    x = rng.standard_normal((16, 8, 28, 28)).astype(np.float32)
    v = rng.standard_normal((16, 8, 14, 14)).astype(np.float32)
    step = dq.value_and_grad(_pooled_loss)
    want = dq.jit(step, target="cpu")(x, v)
    value, grad = dq.jit(step, target="gpu")(cp.asarray(x), cp.asarray(v))
    np.testing.assert_allclose(cp.asnumpy(value), want[0], rtol=1e-4)
    np.testing.assert_allclose(cp.asnumpy(grad), want[1], rtol=1e-5, atol=1e-6)
