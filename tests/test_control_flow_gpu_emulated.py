"""A scan and its gradient on the gpu target without a GPU (fake_cupy.py, as
test_gpu_emulated.py): the loop driver stacks on the device, each body's kernels are PTX
assembled by ptxas and emulated. Compared with the reference interpreter."""

from __future__ import annotations

import fake_cupy
import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


@pytest.fixture
def cp(monkeypatch):
    with fake_cupy.installed(monkeypatch, sms=2) as module:
        yield module


def test_scan_value_and_gradient_on_the_emulated_gpu(cp):
    rng = np.random.default_rng(0)
    w, h0 = rng.standard_normal((3, 3)).astype(np.float32), np.zeros((2, 3), np.float32)
    xs = rng.standard_normal((3, 2, 3)).astype(np.float32)

    def loss(w, h0, xs):
        h, ys = dq.scan(lambda h, x: (dq.tanh(h @ w + x),) * 2, h0, xs, reverse=True)
        return dq.sum(ys * ys) + dq.sum(dq.cond(dq.sum(h) > 0.0, dq.sin, dq.cos, h))

    want = dq.jit(dq.value_and_grad(loss, argnums=(0, 2)), target="interp")(w, h0, xs)
    got = dq.jit(dq.value_and_grad(loss, argnums=(0, 2)), target="gpu")(
        *[cp.asarray(a) for a in (w, h0, xs)]
    )
    assert isinstance(got[0], fake_cupy.DeviceArray)
    np.testing.assert_allclose(got[0].get(), want[0], rtol=1e-5)
    for g, r in zip(got[1], want[1]):
        assert isinstance(g, fake_cupy.DeviceArray)
        np.testing.assert_allclose(g.get(), r, rtol=1e-4, atol=1e-5)
