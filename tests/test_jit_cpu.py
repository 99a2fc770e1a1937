"""dq.jit on the cpu target (the default) end to end: the MLP step against the hand-written
numpy step, output buffers across calls, threads, the compile report, the disk cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir, stats
from dlvm_eq.errors import DlvmError
from dlvm_eq.models import mlp
from dlvm_eq.pipeline import compile_seconds


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _mlp_data(batch=64, sizes=(784, 256, 10), seed=0):
    params = mlp.init_params(list(sizes), seed=seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = np.eye(sizes[-1], dtype=np.float32)[rng.integers(0, sizes[-1], batch)]
    return params, x, y


def test_cpu_is_the_default_target():
    assert dq.DEFAULT_TARGET == "cpu"
    f = dq.jit(lambda x: dq.exp(x) + 1.0)
    x = np.linspace(-1, 1, 10, dtype=np.float32)
    np.testing.assert_allclose(f(x), np.exp(x) + 1, rtol=1e-6)
    assert f.report(x).target == "cpu" and f.report(x).plan.kernels
    assert dq.jit(lambda x: x + 1.0, target="interp").report(x) is None


def test_mlp_value_and_grad_matches_the_hand_written_numpy_step():
    params, x, y = _mlp_data()
    step = dq.jit(dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3)))
    value, grads = step(*params, x, y)
    want_value, want_grads = mlp.numpy_value_and_grad(*params, x, y)
    assert float(value) == pytest.approx(float(want_value), rel=1e-5)
    for g, w in zip(grads, want_grads):
        assert g.shape == w.shape and g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * np.abs(w).max())
    rep = step.report(*params, x, y)
    assert len(rep.plan.blas_calls) == 5


def test_sgd_training_step_inside_jit_reuses_its_outputs():
    params, x, y = _mlp_data(batch=32, sizes=(20, 16, 5))

    def train(w1, b1, w2, b2, x, y):
        loss, grads = dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3))(w1, b1, w2, b2, x, y)
        return (loss,) + tuple(p - 0.1 * g for p, g in zip((w1, b1, w2, b2), grads))

    step = dq.jit(train)
    ref = [p.copy() for p in params]
    p = params
    losses, addresses = [], set()
    for _ in range(8):
        loss, *p = step(*p, x, y)
        losses.append(float(loss))
        addresses.add(p[0].ctypes.data)
        value, grads = mlp.numpy_value_and_grad(*ref, x, y)
        ref = [r - np.float32(0.1) * g for r, g in zip(ref, grads)]
    assert losses[-1] < losses[0]
    assert len(addresses) <= 3  # new parameters cycle through a few buffers: no fresh pages
    for a, b in zip(p, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_results_of_a_call_survive_the_next_call():
    f = dq.jit(lambda x, s: (dq.exp(x) * s, dq.sum(x * s, axis=0)))
    x = np.random.default_rng(0).standard_normal((40, 30)).astype(np.float32)
    a, sa = f(x, 1.0)
    a_copy, sa_copy = a.copy(), sa.copy()
    view = a.reshape(-1)[:5]
    b, sb = f(x, 2.0)
    c, sc = f(x, 3.0)
    for old, keep in ((a, a_copy), (sa, sa_copy)):
        np.testing.assert_array_equal(old, keep)
    np.testing.assert_array_equal(view, a_copy.reshape(-1)[:5])
    assert not np.shares_memory(a, b) and not np.shares_memory(b, c) and not np.shares_memory(a, c)
    np.testing.assert_allclose(c, 3 * np.exp(x), rtol=1e-6)


def test_dropped_results_are_reused_and_a_held_view_keeps_its_buffer():
    f = dq.jit(lambda x: dq.tanh(x) * 2.0)
    x = np.ones((64, 64), np.float32)
    first = f(x)
    addr = first.ctypes.data
    del first
    again = f(x)
    assert again.ctypes.data == addr  # the caller dropped it: reused, no fresh pages
    held = again[3:5]  # a view keeps the buffer alive and in use
    del again
    other = f(x * 0)
    assert not np.shares_memory(other, held)
    np.testing.assert_allclose(held, np.tanh(1.0) * 2, rtol=1e-6)


def test_nested_results_of_value_and_grad_are_reused_once_dropped():
    params, x, y = _mlp_data(batch=8, sizes=(12, 8, 3))
    step = dq.jit(dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3)))
    addr = step(*params, x, y)[1][0].ctypes.data
    for _ in range(3):  # the (value, (grads...)) tuples must not keep the buffers alive
        assert step(*params, x, y)[1][0].ctypes.data == addr


def test_concurrent_calls_from_threads_give_correct_results():
    f = dq.jit(lambda x, w: dq.relu(x @ w) + dq.sum(x, axis=1, keepdims=True))
    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 32)).astype(np.float32)
    xs = [rng.standard_normal((64, 32)).astype(np.float32) for _ in range(4)]
    want = [np.maximum(x @ w, 0) + x.sum(axis=1, keepdims=True) for x in xs]
    f(xs[0], w)
    errors = []

    def worker(i):
        for _ in range(50):
            got = f(xs[i], w)
            if not np.allclose(got, want[i], rtol=1e-4, atol=1e-4):
                errors.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_report_shows_egraph_costs_kernels_blas_and_times():
    params, x, y = _mlp_data(batch=16, sizes=(12, 8, 3))
    forward = dq.jit(mlp.loss)  # the module's own e-graph pass
    text = str(forward.report(*params, x, y))
    for word in ("e-graph:", "e-classes", "rules fired:", "cost (model):", "optimize"):
        assert word in text
    step = dq.jit(dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3)))
    text = str(step.report(*params, x, y))
    # issue 32: the gradient's algebra ran with its adjoint, in one e-graph, and only there
    for word in ("second pass skipped", "kernels:", "matmuls: 5", "plan", "kernels"):
        assert word in text
    rep = step.report(*params, x, y)
    assert rep.kernel_names == [k.name for k in rep.plan.kernels]
    secs = compile_seconds()
    assert set(secs) == {"import", "trace", "adjoint", "rules", "optimize", "plan", "kernels"}
    assert secs["trace"] > 0 and secs["optimize"] > 0 and secs["plan"] > 0
    # the compile's own breakdown: every phase it ran, none counted twice
    assert set(rep.phases) >= {"trace", "adjoint", "plan", "kernels"}
    assert "compile time" in str(rep) and "by phase" in str(rep)


def test_argument_errors_are_dlvm_errors():
    m = dq.make_ir(lambda x: x * 2.0)(np.ones(3, np.float32))
    f = dq.compile(m, "lambda")
    with pytest.raises(DlvmError, match="argument 0 has shape"):
        f(np.ones(4, np.float32))
    with pytest.raises(DlvmError, match="takes 1 arguments"):
        f(np.ones(3, np.float32), np.ones(3, np.float32))
    with pytest.raises(DlvmError, match="unknown target"):
        dq.compile(m, "lambda", target="tpu")


def test_gpu_target_without_cuda_is_one_clear_error():
    from dlvm_eq.codegen import GpuUnavailable, gpu_available

    if gpu_available():
        pytest.skip("CUDA works here")
    m = dq.make_ir(lambda x: x * 2.0)(np.ones(3, np.float32))
    with pytest.raises(GpuUnavailable, match="gpu target|CUDA"):
        dq.compile(m, "lambda", target="gpu")


CHILD = """
import json, sys, numpy as np
import dlvm_eq as dq
from dlvm_eq.codegen import stats
f = dq.jit(lambda x: dq.softmax(dq.sigmoid(x * 1.5 + 0.25) * x, axis=1))
x = np.random.default_rng(0).standard_normal((64, 100)).astype(np.float32)
y = f(x)
print(json.dumps({"stats": stats(), "sum": float(y.sum()), "kernels": len(f.report(x).plan.kernels)}))
"""


def test_a_second_process_finds_every_kernel_on_disk(tmp_path):
    # one thread: no worker pool prebuilt beside the compile (runtime/native_pool.prebuild), so
    # that the counts are the plan's kernels alone
    env = dict(os.environ, DLVM_EQ_CACHE_DIR=str(tmp_path), DLVM_EQ_NUM_THREADS="1")
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", CHILD],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=Path(__file__).parent,
        )
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["stats"]["compiled"] == first["kernels"] >= 1
    assert second["stats"]["compiled"] == 0
    assert second["stats"]["loaded_from_disk"] == second["kernels"]
    assert second["sum"] == pytest.approx(first["sum"], rel=1e-6)


def test_kernel_counters_move():
    before = stats()
    f = dq.jit(lambda x: dq.cosh(x) * 3.0 - 1.25)
    f(np.ones(7, np.float32))
    after = stats()
    assert sum(after[k] for k in ("compiled", "loaded_from_disk", "memory_hits")) > sum(
        before[k] for k in ("compiled", "loaded_from_disk", "memory_hits")
    )
