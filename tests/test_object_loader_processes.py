"""Many processes share one kernel cache (codegen/runtime/object_loader.py, runtime/jit.py):
six processes start together on an empty cache, each compiling and writing the same kernels
while the others read them, then six more start together on the filled cache and load every
kernel from it without LLVM. Every process's results equal numpy's float64 ones (to float32
rounding), no entry is counted corrupt, and the second wave compiles nothing. A process that
read a half-written entry, loaded another kernel's code or relocated it wrongly fails here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlvm_eq.codegen.runtime import object_loader

pytestmark = pytest.mark.skipif(not object_loader.supported(), reason="x86-64 Linux only")

ROOT = Path(__file__).resolve().parents[1]
AT_ONCE = 6
LIMIT_S = 300  # per wave: a hang, not a slow machine

# Several kernel families (map, row, reduction, GEMM epilogue), all checked against float64 numpy.
CHILD = """
import json, sys
import numpy as np
import dlvm_eq as dq
from dlvm_eq.codegen.runtime import cpu_kernel
from dlvm_eq.cache import shared_cache

rng = np.random.default_rng(int(sys.argv[1]))
x = rng.standard_normal((64, 96)).astype(np.float32)
w = (rng.standard_normal((96, 48)) * 0.1).astype(np.float32)
x64, w64 = x.astype(np.float64), w.astype(np.float64)

def softmax(v):
    e = np.exp(v - v.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)

cases = [
    (dq.jit(lambda x: dq.tanh(x) * 2.0 + dq.exp(-x)), (x,), np.tanh(x64) * 2.0 + np.exp(-x64)),
    (dq.jit(lambda x: dq.softmax(x, axis=1)), (x,), softmax(x64)),
    (dq.jit(lambda x: dq.sum(dq.sin(x) * x, axis=0)), (x,), (np.sin(x64) * x64).sum(axis=0)),
    (dq.jit(lambda x, w: dq.relu(x @ w) * 0.5), (x, w), np.maximum(x64 @ w64, 0) * 0.5),
    (dq.jit(dq.grad(lambda w, x: dq.sum(dq.tanh(x @ w)))), (w, x),
     x64.T @ (1 - np.tanh(x64 @ w64) ** 2)),
]
errors = []
for f, args, want in cases:
    got = np.asarray(f(*args), np.float64)
    errors.append(float(np.max(np.abs(got - want) / (1 + np.abs(want)))))
print(json.dumps({"errors": errors, "counters": dict(cpu_kernel.JIT.counters),
                  "corrupt": shared_cache().corrupt}))
"""


def _wave(env: dict, seeds: range) -> list[dict]:
    """Start one process per seed at once; wait for all; return each one's JSON line."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(seed)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in seeds
    ]
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("a process sharing the kernel cache hung")
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_processes_sharing_one_cache_compile_and_load_the_same_kernels(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), DLVM_EQ_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("DLVM_EQ_NO_IR_CACHE", None)
    first = _wave(env, range(AT_ONCE))
    second = _wave(env, range(AT_ONCE, 2 * AT_ONCE))
    for r in first + second:
        assert max(r["errors"]) < 1e-4, r
        assert r["corrupt"] == 0, r
    assert sum(r["counters"]["compiled"] for r in first) > 0  # the first wave built kernels
    for r in second:  # the second wave found every kernel on disk and loaded it without LLVM
        assert r["counters"]["compiled"] == 0, r
        assert r["counters"]["loaded_natively"] == r["counters"]["loaded_from_disk"] > 0, r
