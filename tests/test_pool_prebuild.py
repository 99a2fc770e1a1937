"""The native worker pool's code compiles on a thread of its own from the start of a cpu
compile (codegen/runtime/native_pool.prebuild), once, beside the e-graph: each fresh process
here (empty cache) records which thread compiled what, and its results equal float64 numpy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dlvm_eq.codegen.runtime import native_pool

pytestmark = pytest.mark.skipif(not native_pool.supported(), reason="x86-64 Linux only")

CHILD = """
import json, sys, threading
import numpy as np
import dlvm_eq as dq
from dlvm_eq.codegen.runtime import jit

compiled = []  # (thread name, pool code?) per LLVM compile
compile_object = jit.compile_object
def record(text, *args):
    compiled.append((threading.current_thread().name, "dq_pool_" in text))
    return compile_object(text, *args)
jit.compile_object = record

rng = np.random.default_rng(0)
x = rng.standard_normal((256, 64)).astype(np.float32)
w = (rng.standard_normal((64, 32)) * 0.2).astype(np.float32)
def loss(w, x):
    return dq.mean(dq.tanh(x @ w) ** 2)
value, grad = dq.jit(dq.value_and_grad(loss))(w, x)
x64, w64 = x.astype(np.float64), w.astype(np.float64)
t = np.tanh(x64 @ w64)
want_grad = x64.T @ (2 * t * (1 - t * t)) / t.size
error = max(abs(float(value) - float((t * t).mean())),
            float(np.max(np.abs(np.asarray(grad, np.float64) - want_grad))))
print(json.dumps({"compiled": compiled, "error": error,
                  "threads": [t.name for t in threading.enumerate()],
                  "counters": dict(jit.JIT.counters)}))
"""


def _child(tmp_path, threads: str) -> dict:
    env = dict(
        os.environ,
        DLVM_EQ_NUM_THREADS=threads,
        DLVM_EQ_CACHE_DIR=str(tmp_path / f"cache{threads}"),
        OPENBLAS_NUM_THREADS="1",
    )
    run = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_pool_code_compiles_once_on_its_own_thread(tmp_path):
    row = _child(tmp_path, "2")
    pool = [name for name, is_pool in row["compiled"] if is_pool]
    assert pool == ["dlvm_eq-pool-prebuild"]  # once, and not in the first call
    kernels = [name for name, is_pool in row["compiled"] if not is_pool]
    assert kernels and row["counters"]["compiled"] == len(kernels) + 1
    assert "dlvm_eq-pool-prebuild" not in row["threads"]  # joined by the first call
    assert row["error"] < 1e-5


def test_one_usable_cpu_starts_no_pool_and_builds_no_pool_code(tmp_path):
    row = _child(tmp_path, "1")
    assert not any(is_pool for _, is_pool in row["compiled"])
    assert row["error"] < 1e-5


def test_processes_that_exit_during_the_prebuild_exit_cleanly(tmp_path):
    """A process whose compile fails at once (a shape error in the trace) exits while the pool's
    code may still be compiling: it ends normally, the thread finishing its cache write."""
    code = (
        "import numpy as np, dlvm_eq as dq\n"
        "from dlvm_eq.errors import DlvmError\n"
        "f = dq.jit(lambda a, b: a @ b)\n"
        "try:\n    f(np.ones((3, 4), np.float32), np.ones((5, 6), np.float32))\n"
        "except DlvmError:\n    print('DlvmError')\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=dict(os.environ, DLVM_EQ_NUM_THREADS="2", DLVM_EQ_CACHE_DIR=str(tmp_path / "c")),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        assert out.strip() == "DlvmError"
