"""The shipped CPU machine's BLAS rate (extract/machine.py): a measured per-thread rate times
the threads OpenBLAS runs, read as OpenBLAS reads them."""

from __future__ import annotations

import os

from dlvm_eq.extract.machine import BLAS_RATE_PER_THREAD, MACHINES, blas_threads


def test_blas_threads_reads_openblas_then_omp_then_the_affinity_mask():
    cpus = len(os.sched_getaffinity(0))
    assert blas_threads({"OPENBLAS_NUM_THREADS": "3", "OMP_NUM_THREADS": "5"}) == 3
    assert blas_threads({"OMP_NUM_THREADS": "5"}) == 5
    assert blas_threads({}) == cpus
    # what OpenBLAS ignores counts as unset
    assert blas_threads({"OPENBLAS_NUM_THREADS": "0", "OMP_NUM_THREADS": "2"}) == 2
    assert blas_threads({"OPENBLAS_NUM_THREADS": "two"}) == cpus


def test_the_shipped_rate_is_one_threads_rate_per_blas_thread():
    assert MACHINES["cpu"].blas_rate == BLAS_RATE_PER_THREAD * blas_threads()
    # one thread here: 97-103 GFLOP/s measured; the old 300 was three times that
    assert 50e9 <= BLAS_RATE_PER_THREAD <= 150e9
