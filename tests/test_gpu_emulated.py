"""The GPU target end to end without a GPU: the launcher and the program executor run with a
stand-in CuPy (`fake_cupy.py`) that assembles each loaded PTX with ptxas, checks every launch
argument against the `.entry`'s parameters and executes every (block, thread) of each launch
through the kernel's host-emulation build. Results are compared with the reference
interpreter and with the CPU target. The device has 2 SMs, so grid-stride loops go round
several times and split reductions combine partial rows, as on a busy GPU.

What this cannot check is CuPy and the driver themselves: `scripts/gpu-check` runs the `gpu`
tests on a real device."""

from __future__ import annotations

import fake_cupy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_programs import random_function, random_inputs

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.kernels.kernel_spec import KernelInput, KernelSpec, ReduceSpec
from dlvm_eq.codegen.kernels.spec import Load
from dlvm_eq.ir import F64, Module, interpret
from dlvm_eq.models import mlp
from dlvm_eq.pipeline import compile

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


@pytest.fixture
def cp(monkeypatch):
    with fake_cupy.installed(monkeypatch, sms=2) as module:
        yield module


def _host(a) -> np.ndarray:
    assert isinstance(a, fake_cupy.DeviceArray), (
        f"a GPU result should stay on the device, got {type(a)}"
    )
    return a.get()


def test_mlp_gradient_on_the_emulated_gpu_matches_the_cpu(cp):
    params = mlp.init_params([64, 32, 10])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 32)]
    module = dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3)).lower(*params, x, y)
    name = next(iter(module.functions))
    gpu = compile(module, name, target="gpu")(*[cp.asarray(a) for a in (*params, x, y)])
    cpu = compile(module, name, target="cpu")(*params, x, y)
    assert len(gpu) == len(cpu) == 5
    for g, c in zip(gpu, cpu):
        np.testing.assert_allclose(_host(g), c, rtol=1e-5, atol=1e-6)


def test_jitted_training_step_runs_on_the_emulated_gpu(cp):
    """The demo's step, `jit(value_and_grad(loss))` on the gpu target, inputs on the device."""
    params = mlp.init_params([64, 32, 10], seed=1)
    rng = np.random.default_rng(5)
    x = rng.random((16, 64), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 16)]
    step = dq.jit(dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3)), target="gpu")
    loss, grads = step(*[cp.asarray(a) for a in (*params, x, y)])
    want_loss, want_grads = mlp.numpy_value_and_grad(*params, x, y)
    np.testing.assert_allclose(_host(loss), want_loss, rtol=1e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(_host(g), w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (257, 1000)])
def test_softmax_and_elementwise_chain_on_the_emulated_gpu(cp, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    f = dq.jit(lambda x: (dq.softmax(x, axis=1), dq.sigmoid(x * 1.5 + 0.25) * x), target="gpu")
    s, c = f(cp.asarray(x))
    w = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    np.testing.assert_allclose(_host(s), w / w.sum(1, keepdims=True), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(
        _host(c), x / (1 + np.exp(-(1.5 * x.astype(np.float64) + 0.25))), rtol=2e-6, atol=1e-7
    )


def test_layouts_concatenate_and_host_arguments_on_the_emulated_gpu(cp):
    x = np.random.default_rng(2).standard_normal((64, 100)).astype(np.float32)
    c = np.random.default_rng(3).standard_normal((64, 1)).astype(np.float32)
    f = dq.jit(
        lambda x, c: (dq.transpose(dq.exp(x)) * 2.0, dq.max(dq.where(x > c, x, c), axis=0)),
        target="gpu",
    )
    t, m = f(x, c)  # numpy arguments are copied to the device
    np.testing.assert_allclose(_host(t), np.exp(x).T * 2.0, rtol=2e-6)
    np.testing.assert_array_equal(_host(m), np.where(x > c, x, c).max(axis=0))
    g = dq.jit(lambda a, b: dq.concatenate([a @ b, dq.transpose(b)], axis=0), target="gpu")
    a, b = x[:, :64], x[:64, :64].T.copy()
    np.testing.assert_allclose(
        _host(g(cp.asarray(a), cp.asarray(b))),
        np.concatenate([a @ b, b.T], axis=0),
        rtol=1e-4,
        atol=1e-4,
    )


def test_slices_on_the_emulated_gpu(cp):
    """Slices are copies out of a buffer (CuPy indexing): of a parameter, of a kernel's output
    and into a BLAS call; an LSTM-like gate split and its gradient (zero padding)."""
    x = np.random.default_rng(5).standard_normal((8, 12)).astype(np.float32)
    w = np.random.default_rng(6).standard_normal((12, 8)).astype(np.float32)
    f = dq.jit(lambda x, w: (dq.exp(x)[:, 2:6] * 2.0, x[1:5] @ w, dq.tanh(x[-1])), target="gpu")
    a, b, c = f(cp.asarray(x), cp.asarray(w))
    np.testing.assert_allclose(_host(a), np.exp(x)[:, 2:6] * 2.0, rtol=2e-6)
    np.testing.assert_allclose(_host(b), x[1:5] @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_host(c), np.tanh(x[-1]), rtol=2e-6, atol=1e-7)

    def gates(x, w):
        i, f_, o = dq.split(x @ w, [2, 5], axis=1)
        return dq.sum(dq.sigmoid(i) * dq.tanh(o[:, :2]) + f_[:, 1:] * f_[:, :2])

    g = dq.jit(dq.grad(gates, argnums=1), target="gpu")
    want = dq.jit(dq.grad(gates, argnums=1), target="interp")(x, w)
    np.testing.assert_allclose(_host(g(cp.asarray(x), cp.asarray(w))), want, rtol=1e-4, atol=1e-5)


def test_long_reduction_is_split_across_blocks_and_combined(cp):
    """Few outputs, many reduced elements: blockIdx.y takes slices whose partial rows the
    launcher combines (max and a sum whose identity differs from its initial value)."""
    from dlvm_eq.codegen.gpu.gpu_runtime import compile_gpu

    x = np.random.default_rng(4).standard_normal((3, 40000)).astype(np.float64)
    for op, want in (("add", x.sum(axis=1) + 2.5), ("max", np.maximum(x.max(axis=1), 2.5))):
        spec = ReduceSpec(f"r_{op}", x.shape, (KernelInput("f64"),), Load(0), op, (1,), init=2.5)
        k = compile_gpu(spec)
        got = k(cp.asarray(x))
        assert k._fn.launches == 1
        np.testing.assert_allclose(_host(got).reshape(-1), want, rtol=1e-12)


def test_the_stand_in_rejects_what_a_real_launch_would_get_wrong(cp):
    """The checks have teeth: a wrong integer width, a host array and a strided array fail."""
    from dlvm_eq.codegen.gpu.gpu_runtime import compile_gpu

    spec = KernelSpec("copy", (10,), (KernelInput("f32"),), (Load(0),))
    k = compile_gpu(spec)
    x, out = cp.asarray(np.arange(10, dtype=np.float32)), cp.empty((10,), np.float32)
    assert k.ptx.index_bits == 32
    k._fn((1,), (32,), (np.int32(10), out, x, *k._tail))
    np.testing.assert_array_equal(out.get(), np.arange(10))
    with pytest.raises(TypeError, match="must be int32"):
        k._fn((1,), (32,), (np.int64(10), out, x, *k._tail))
    with pytest.raises(TypeError, match="not a device array"):
        k._fn((1,), (32,), (np.int32(10), out, np.arange(10, dtype=np.float32), *k._tail))
    with pytest.raises(ValueError, match="C-contiguous"):
        k._fn((1,), (32,), (np.int32(10), cp.empty((20,), np.float32)[::2], x, *k._tail))


@settings(max_examples=40, **SETTINGS)
@given(st.data())
def test_random_programs_on_the_emulated_gpu_agree_with_the_interpreter(cp, data):
    fn = random_function(data.draw, n_ops=data.draw(st.integers(1, 16)), dtype=F64)
    m = Module("random")
    m.add(fn)
    args = random_inputs(fn, np.random.default_rng(0))
    got = compile(m, fn.name, target="gpu")(*args)
    want = interpret(m, fn.name, *args)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        g = _host(g)
        assert g.shape == w.shape
        if w.dtype.kind == "f":
            np.testing.assert_allclose(
                g,
                w,
                rtol=1e-9,
                atol=1e-12 * max(1.0, float(np.abs(w).max(initial=0))),
                equal_nan=True,
            )
        else:
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("shape", [(1, 5), (9000, 3), (33, 64), (5, 65)])
def test_row_kernels_for_short_rows_on_the_emulated_gpu(cp, shape):
    """One thread per row for rows of at most GPU_ROW_COLS elements (9000 rows: the grid-stride
    loop over rows wraps on 2 SMs); longer rows stay a reduction and a map."""
    from dlvm_eq.codegen.planning.plan import RowStep
    from dlvm_eq.codegen.planning.planner import GPU_ROW_COLS

    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)

    def layernorm_softmax(x):
        mu = dq.mean(x, axis=1, keepdims=True)
        var = dq.mean(dq.square(x - mu), axis=1, keepdims=True)
        return dq.softmax(x, axis=1), (x - mu) * dq.rsqrt(var + 1e-5)

    f = dq.jit(layernorm_softmax, target="gpu")
    s, n = f(cp.asarray(x))
    rows = [k for k in f.report(x).plan.kernels if isinstance(k, RowStep)]
    assert bool(rows) == (shape[1] <= GPU_ROW_COLS)
    x64 = x.astype(np.float64)
    w = np.exp(x64 - x64.max(1, keepdims=True))
    np.testing.assert_allclose(_host(s), w / w.sum(1, keepdims=True), rtol=2e-6, atol=1e-7)
    mu = x64.mean(1, keepdims=True)
    want = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(_host(n), want, rtol=1e-4, atol=1e-5)


def _run_with_stand_in(tmp_path, args):
    """Run a Python command line with the stand-in importable as `cupy`."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    (tmp_path / "cupy").mkdir(exist_ok=True)
    (tmp_path / "cupy" / "__init__.py").write_text("from fake_cupy import *  # noqa: F401,F403\n")
    path = os.pathsep.join([str(tmp_path), str(tests), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, DLVM_EQ_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(
        [sys.executable, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tests.parent,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_demo_trains_on_the_gpu_target_with_the_stand_in(tmp_path):
    out = _run_with_stand_in(
        tmp_path,
        [
            "-c",
            "import sys; from dlvm_eq.cli import main; "
            "sys.exit(main(['demo', '--target', 'gpu', '--epochs', '2']))",
        ],
    )
    assert "compiled @loss for gpu" in out and "test accuracy:" in out


def test_mlp_step_benchmark_runs_its_gpu_path_on_the_stand_in(tmp_path):
    """`benchmarks/mlp_step.py --target gpu` (what scripts/gpu-check runs on a device) keeps its
    arrays on the device, checks every implementation and times it: run here with the
    stand-in as `cupy` (the figures mean nothing; the path and the checks do)."""
    out = _run_with_stand_in(
        tmp_path,
        [
            "benchmarks/mlp_step.py",
            "--target",
            "gpu",
            "--rounds",
            "1",
            "--steps",
            "2",
            "--warmup",
            "0",
            "--compile-repeats",
            "0",
        ],
    )
    for name in ("dlvm_eq (gpu)", "CuPy hand-written"):
        assert f"check {name}: loss, gradients and SGD step agree" in out, out[-3000:]
    assert "check dlvm_eq, SGD inside the jit (gpu): loss and SGD step agree" in out
    assert "| CuPy: the 5 matmuls alone |" in out
