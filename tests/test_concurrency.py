"""Concurrent calls from many Python threads: every result right, 0 mismatches.

- the swapped GEMM path (a narrow product with a transposed A, computed as out.T = b.T @ a.T
  into a scratch matrix, then copied) from 4 threads: its scratch used to be shared per
  output shape, so a second thread overwrote it between another's product and its copy;
- 8 threads calling the SAME compiled programs (random hypothesis programs with every float32
  product through our GEMM, and programs built to reach the swapped and epilogue paths, row
  kernels and long reductions) many times each, against the float64 interpreter and bitwise
  against the program's single-threaded result.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from dlvm_eq.codegen import gemm_runtime, set_cache_dir


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _in_threads(n: int, work) -> list:
    """Run work(i) on n threads at once (released together); the exceptions they raised."""
    errors: list = []
    start = threading.Barrier(n)

    def run(i):
        try:
            start.wait()
            work(i)
        except BaseException as e:       # noqa: BLE001 - reported by the caller
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    return errors


def test_swapped_narrow_products_from_four_threads():
    """a.T @ b with a (64, 512), b (64, 10): the swapped path (512x64 transposed A, 10 columns)."""
    rng = np.random.default_rng(0)
    pairs = [(rng.standard_normal((64, 512), dtype=np.float32), rng.standard_normal((64, 10), dtype=np.float32))
             for _ in range(4)]
    wants = []
    for a, b in pairs:
        out = np.empty((512, 10), np.float32)
        assert gemm_runtime.matmul(a.T, b, out)
        np.testing.assert_allclose(out, a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
        wants.append(out)
    assert (512, 10) in gemm_runtime._swap.scratch     # it took the swapped path
    bad = [0] * 4

    def work(i):
        a, b = pairs[i]
        for _ in range(1500):
            out = np.empty((512, 10), np.float32)
            gemm_runtime.matmul(a.T, b, out)
            bad[i] += not np.array_equal(out, wants[i])
    assert not _in_threads(4, work)
    assert bad == [0] * 4, f"wrong results per thread: {bad}"
