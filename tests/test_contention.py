"""Compiled programs on one CPU and on a busy machine: right answers (against the reference
interpreter, float64), and with one usable CPU no helper thread at all. Correctness only:
no timings (the contention figures are benchmarks, not tests)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

# The MLP step (GEMMs with epilogues, row kernels, reductions) and a parallel elementwise +
# reduction program, each against the interpreter on float64 copies of the inputs.
_PROGRAMS = textwrap.dedent("""
    import numpy as np, dlvm_eq as dq
    from dlvm_eq.models import mlp

    def programs(seed):
        rng = np.random.default_rng(seed)
        p = mlp.init_params([784, 256, 10], seed=seed)
        x = rng.random((256, 784), dtype=np.float32)
        y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
        big = rng.standard_normal((512, 1024)).astype(np.float32)
        vg = dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3))
        chain = lambda a: (dq.sum(dq.sigmoid(a * 1.5 + 0.25) * a, axis=0), dq.tanh(a) * 2.0)
        return [(vg, (*p, x, y)), (chain, (big,))]

    def flat(v):
        if isinstance(v, (tuple, list)):
            return [a for e in v for a in flat(e)]
        return [np.asarray(v, np.float64)]

    def check(seed, reps):
        for fn, args in programs(seed):
            f, ref = dq.jit(fn), dq.jit(fn, target="interp")
            want = flat(ref(*[a.astype(np.float64) for a in args]))
            for _ in range(reps):
                got = flat(f(*args))
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-4)
""")

_ONE_CPU = _PROGRAMS + textwrap.dedent("""
    import json, threading
    from dlvm_eq.codegen.runtime.cpu_count import usable_cpus
    from dlvm_eq.codegen.runtime.native_pool import native_pool
    check(0, 3)
    print(json.dumps(dict(cpus=usable_cpus(), pool=native_pool() is not None,
                          threads=[t.name for t in threading.enumerate()])))
""")


def _run_child(env_extra, prefix=()):
    env = {k: v for k, v in os.environ.items() if k != "DLVM_EQ_NUM_THREADS"}
    env.update(PYTHONPATH=str(ROOT), **env_extra)
    out = subprocess.run(
        [*prefix, sys.executable, "-c", _ONE_CPU],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))  # shared: the second child loads kernels


@pytest.mark.skipif(not shutil.which("taskset"), reason="needs taskset")
def test_one_cpu_right_answers_and_no_helper_threads(cache):
    got = _run_child(
        {"DLVM_EQ_CACHE_DIR": cache}, ("taskset", "-c", str(min(os.sched_getaffinity(0))))
    )
    assert got["cpus"] == 1 and not got["pool"]
    assert not [t for t in got["threads"] if t.startswith(("dq-native", "dq-kernel"))], got[
        "threads"
    ]


def test_one_thread_setting_starts_no_helper_threads(cache):
    got = _run_child({"DLVM_EQ_CACHE_DIR": cache, "DLVM_EQ_NUM_THREADS": "1"})
    assert got["cpus"] == 1 and not got["pool"]
    assert not [t for t in got["threads"] if t.startswith(("dq-native", "dq-kernel"))], got[
        "threads"
    ]


@pytest.fixture
def busy_core():
    """`python -c 'while True: pass'` pinned to one of our CPUs, for the test's duration."""
    cpu = max(os.sched_getaffinity(0))
    spinner = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    time.sleep(0.2)
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait(30)


def test_right_answers_while_a_core_is_busy(busy_core):
    ns: dict = {}
    exec(_PROGRAMS, ns)
    for seed in range(2):
        ns["check"](seed, 10)


def test_pool_counts_exactly_once_while_a_core_is_busy(busy_core):
    from pool_kernels import count_kernel

    from dlvm_eq.codegen.runtime.native_pool import (
        NativePool,
        _tsc_per_us,
        entry_address,
        supported,
    )

    if not supported():
        pytest.skip("the native pool is Linux x86-64 only")
    pool = NativePool(entry_address(), max(2, len(os.sched_getaffinity(0))))  # oversubscribed
    try:
        rng = np.random.default_rng(0)
        tick = int(_tsc_per_us())
        for i in range(400):
            n = int(rng.integers(1, 5000))
            chunks = int(rng.integers(1, 64))
            step = -(-n // chunks)
            counts = np.zeros(n, np.int64)
            pool.run(
                count_kernel(),
                [
                    (lo, min(lo + step, n), counts.ctypes.data, tick * (i % 3))
                    for lo in range(0, n, step)
                ],
            )
            assert (counts == 1).all(), i
    finally:
        pool.close()
