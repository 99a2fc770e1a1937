"""Whole programs for the GPU: every kernel of the plans the gpu target builds is assembled by
`ptxas` for sm_75 and sm_90 (skipped only where ptxas is absent), and, where CUDA works, the
compiled programs run on the device (`gpu` marker) and agree with the CPU."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen import gpu_available, ptx_kernel, rows_for, set_cache_dir
from dlvm_eq.codegen.planning.plan import RowStep
from dlvm_eq.models import mlp
from dlvm_eq.pipeline import plan_function

PTXAS = shutil.which("ptxas")
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="ptxas is not on PATH")
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="CUDA is not usable here")


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _mlp_grad(batch=32, sizes=(64, 32, 10)):
    params = mlp.init_params(list(sizes))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = np.eye(sizes[-1], dtype=np.float32)[rng.integers(0, sizes[-1], batch)]
    return dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3)).lower(*params, x, y), (*params, x, y)


def _programs():
    x = np.zeros((64, 100), np.float32)
    yield "mlp_grad", _mlp_grad()[0]
    yield "softmax", dq.make_ir(lambda x: dq.softmax(x, axis=1))(x)
    yield "chain", dq.make_ir(lambda x: dq.sigmoid(x * 1.5 + 0.25) * x)(x)
    yield (
        "layouts",
        dq.make_ir(
            lambda x, c: (dq.transpose(dq.exp(x)) * 2.0, dq.max(dq.where(x > c, x, c), axis=0))
        )(x, np.zeros((64, 1), np.float32)),
    )


@needs_ptxas
@pytest.mark.parametrize("name, module", list(_programs()), ids=[n for n, _ in _programs()])
@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_every_kernel_of_a_gpu_plan_assembles(name, module, arch, tmp_path):
    fn = next(iter(module.functions))
    plan = plan_function(module[fn], module, rows=rows_for("gpu"), target="gpu")
    assert plan.kernels
    # one thread per row: row kernels only for short rows (the MLP's 10 classes, not 100 columns)
    assert any(isinstance(k, RowStep) for k in plan.kernels) == (name == "mlp_grad")
    for k in plan.kernels:
        src = tmp_path / f"{k.name}.ptx"
        src.write_text(ptx_kernel(k.spec, arch).ptx)
        r = subprocess.run(
            [PTXAS, f"-arch={arch}", str(src), "-o", str(tmp_path / f"{k.name}.cubin")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, f"{name}/{k.name}: ptxas -arch={arch} failed:\n{r.stderr}"


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@needs_gpu
def test_mlp_gradient_on_the_gpu_matches_the_cpu():
    import cupy as cp

    module, args = _mlp_grad()
    name = next(iter(module.functions))  # "loss_grad": the traced value_and_grad
    gpu = dq.compile(module, name, target="gpu")(*[cp.asarray(a) for a in args])
    cpu = dq.compile(module, name, target="cpu")(*args)
    for g, c in zip(gpu, cpu):
        assert isinstance(g, cp.ndarray)
        np.testing.assert_allclose(cp.asnumpy(g), c, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (257, 1000)])
def test_softmax_and_chain_on_the_gpu(shape):
    import cupy as cp

    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    f = dq.jit(lambda x: (dq.softmax(x, axis=1), dq.sigmoid(x * 1.5 + 0.25) * x), target="gpu")
    s, c = f(cp.asarray(x))
    w = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(cp.asnumpy(s), w / w.sum(1, keepdims=True), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(
        cp.asnumpy(c), x / (1 + np.exp(-(1.5 * x + 0.25))), rtol=2e-6, atol=1e-7
    )


@pytest.mark.gpu
@needs_gpu
def test_gpu_layouts_concatenate_and_numpy_arguments():
    import cupy as cp

    x = np.random.default_rng(2).standard_normal((64, 100)).astype(np.float32)
    c = np.random.default_rng(3).standard_normal((64, 1)).astype(np.float32)
    for _, module in list(_programs())[3:]:
        gpu = dq.compile(module, "lambda", target="gpu")(x, c)  # numpy in: copied over
        cpu = dq.compile(module, "lambda", target="cpu")(x, c)
        for g, h in zip(gpu, cpu):
            np.testing.assert_allclose(cp.asnumpy(g), h, rtol=2e-6)
    f = dq.jit(lambda a, b: dq.concatenate([a @ b, dq.transpose(b)], axis=0), target="gpu")
    a, b = x[:, :64], x[:64, :64].T.copy()
    np.testing.assert_allclose(
        cp.asnumpy(f(cp.asarray(a), cp.asarray(b))),
        np.concatenate([a @ b, b.T], axis=0),
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.gpu
@needs_gpu
def test_out_of_range_ids_on_the_gpu_are_the_interpreters_error():
    """CuPy's gathers clamp ids; the program still raises as the CPU does, and good ids work."""
    import cupy as cp

    from dlvm_eq.errors import DlvmError

    emb = np.arange(24.0, dtype=np.float32).reshape(6, 4)
    vg = dq.jit(dq.value_and_grad(lambda e, i: dq.sum(dq.tanh(e[i]) * 1.5)), target="gpu")
    with pytest.raises(
        DlvmError, match=r"take: index 6 \(position 2\) is out of range for an axis of size 6"
    ):
        vg(cp.asarray(emb), cp.asarray(np.array([5, 1, 6], np.int32)))
    good = np.array([5, 1, 1], np.int32)
    value, grad = vg(cp.asarray(emb), cp.asarray(good))
    want = np.zeros_like(emb)
    np.add.at(want, good, 1.5 * (1 - np.tanh(emb[good]) ** 2))
    np.testing.assert_allclose(cp.asnumpy(grad), want, rtol=1e-5, atol=1e-6)
