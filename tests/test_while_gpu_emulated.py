"""while_loop and fori_loop with traced bounds on the gpu target without a GPU (fake_cupy.py,
as test_control_flow_gpu_emulated.py): the Python loop driver runs the test and the body, each
compiled once to PTX (assembled by ptxas) and emulated; the test's bool is read back each step.
Compared with the reference interpreter and numpy."""

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


def fori(a, h0, n):
    return dq.fori_loop(0, n, lambda i, h: dq.tanh(h @ a) + dq.astype(i, h.dtype) * 0.1, h0)


def newton(a, x0):
    def body(c):
        nx = 0.5 * (c[0] + a / c[0])
        return nx, nx - c[0]

    return dq.while_loop(lambda c: dq.max(dq.abs(c[1])) > 1e-4, body, (x0, x0))[0]


@pytest.mark.parametrize("n", [0, 5])
def test_fori_loop_with_a_traced_bound_on_the_emulated_gpu(cp, n):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((4, 4)) * 0.5).astype(np.float32)
    h0 = rng.standard_normal((3, 4)).astype(np.float32)
    want = dq.jit(fori, target="interp")(a, h0, np.int32(n))
    got = dq.jit(fori, target="gpu")(cp.asarray(a), cp.asarray(h0), cp.asarray(np.int32(n)))
    assert isinstance(got, fake_cupy.DeviceArray)
    np.testing.assert_allclose(got.get(), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_a_data_dependent_while_loop_on_the_emulated_gpu(cp):
    rng = np.random.default_rng(1)
    a = rng.uniform(1.0, 9.0, (3, 5)).astype(np.float32)
    x0 = np.ones((3, 5), np.float32)
    got = dq.jit(newton, target="gpu")(cp.asarray(a), cp.asarray(x0))
    assert isinstance(got, fake_cupy.DeviceArray)
    np.testing.assert_allclose(got.get(), np.sqrt(a.astype(np.float64)), rtol=1e-5)
    np.testing.assert_allclose(got.get(), dq.jit(newton, target="interp")(a, x0), rtol=1e-6)
