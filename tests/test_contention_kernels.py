"""The native kernel families of real models (im2col/col2im, pools, take/scatterAdd, cumsum,
batched GEMM; tests/kernel_families_program.py) called from many Python threads beside a
CPU-hogging process and beside OpenBLAS's own threads, on the native pool and on Python threads
(DLVM_EQ_NATIVE_POOL=0): every result equals the interpreter's,
concurrent calls agree bitwise, and the process finishes (a subprocess with a timeout; the
native pool's caller takes every unclaimed chunk itself, so a descheduled worker delays a call
but cannot stall it). Correctness only: no timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_contention import busy_core  # noqa: F401 - the fixture: a spinning process on one of our CPUs

ROOT = Path(__file__).resolve().parents[1]

# Counts the threaded dispatches of each family (their modules' run_ranges; the batched
# GEMM's plans' parts), so that the test knows every family really ran split over threads.
_CHILD = textwrap.dedent("""
    import json, sys, threading
    import numpy as np
    sys.path.insert(0, {tests!r})
    from kernel_families_program import STEP, step_args, reference, check_from_threads
    import dlvm_eq as dq
    from dlvm_eq.codegen.runtime import batch_gemm, conv_kernel, index_kernel, pool_kernel
    from dlvm_eq.codegen.runtime.native_pool import running_pool

    split = dict.fromkeys(["conv", "index", "pool"], 0)

    def counting(family, run):
        def run_ranges(fn, ranges, tail, threads):
            split[family] += len(ranges) > 1 and threads > 1
            return run(fn, ranges, tail, threads)
        return run_ranges
    for family, mod in (("conv", conv_kernel), ("index", index_kernel), ("pool", pool_kernel)):
        mod.run_ranges = counting(family, mod.run_ranges)

    stop = threading.Event()
    blas_calls = [0]

    def openblas():                    # numpy's BLAS threads spin beside our kernels
        a = np.random.default_rng(9).standard_normal((384, 384))
        while not stop.is_set():
            a = np.tanh(a @ a) ; blas_calls[0] += 1
    args = step_args(0)
    want = reference(args)
    f = dq.jit(STEP)
    hog = threading.Thread(target=openblas, daemon=True)
    hog.start()
    errors = check_from_threads(f, args, want, threads={threads}, reps={reps})
    stop.set(); hog.join(60)
    pool = running_pool()
    print(json.dumps(dict(errors=errors, split=split, blas_calls=blas_calls[0],
                          batched_parts=max((len(p.parts) for p in batch_gemm._LAUNCHES.idle() if p), default=0),
                          pool=None if pool is None else pool.caller_stats())))
""")


def _run_child(threads: int, reps: int, cache: str, native_pool: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DLVM_EQ_NUM_THREADS"}
    env.update(
        PYTHONPATH=str(ROOT),
        DLVM_EQ_CACHE_DIR=cache,
        DLVM_EQ_GEMM="1",
        DLVM_EQ_NATIVE_POOL=native_pool,
    )
    script = _CHILD.format(tests=str(ROOT / "tests"), threads=threads, reps=reps)
    # generous: a loaded 2-core machine runs this in well under a minute; a stall would not end
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=400
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))  # shared: the second child loads the program


@pytest.mark.parametrize("native_pool", ["1", "0"])  # the native pool, or Python threads
def test_kernel_families_from_many_threads_beside_a_busy_process_and_openblas(
    busy_core, cache, native_pool
):
    got = _run_child(threads=6, reps=3, cache=cache, native_pool=native_pool)
    assert got["errors"] == [], got["errors"]
    if len(os.sched_getaffinity(0)) > 1:  # with one CPU nothing is split (test_contention)
        assert all(got["split"].values()), (
            f"a kernel family never ran split over threads: {got['split']}"
        )
        assert got["batched_parts"] > 1, "the batched GEMM never ran split over threads"
        assert (got["pool"] is not None) == (native_pool == "1")
    assert got["blas_calls"] > 0, "the OpenBLAS load never ran"
