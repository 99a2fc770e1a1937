"""Kernels compile outside llvmlite's process-wide lock (codegen/cpu/llvm_unlocked.py): an O1-O3
build finishes while another thread holds that lock, gives the same object code as llvmlite's
own calls at every level, reports bad IR as llvmlite does, and many threads or processes
compiling at once get results equal to float64 numpy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import llvmlite.binding as llvm
import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen.cpu import llvm_cpu

LEVELS = [(3, True), (3, False), (2, True), (2, False), (1, True)]


def _kernel_irs(monkeypatch, k: int = 0) -> list[str]:
    """LLVM IR of the kernels (maps, reductions, rows) a program compiles, recorded as
    jit.compile_object is asked for them; k picks constants no other test compiled."""
    from dlvm_eq.codegen.runtime import jit

    texts: list[str] = []
    compile_object = jit.compile_object

    def record(text, speed=3, vectorize=True):
        texts.append(text)
        return compile_object(text, speed, vectorize)

    monkeypatch.setattr(jit, "compile_object", record)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 16))
    c = 1.0 + 0.125 * k
    dq.jit(
        lambda x, w: (
            dq.sum(dq.tanh(x @ w.astype(np.float32)) * dq.exp(-x[:, :16] * c), axis=1)
            + dq.max(dq.sigmoid(x * c), axis=1)
            + dq.sum(dq.softmax(x * c, axis=1) * x, axis=1)
        )
    )(x, w)
    monkeypatch.undo()
    assert len(texts) >= 2
    return texts


def _through_llvmlite(text: str, speed: int, vectorize: bool) -> bytes:
    """The build by llvmlite's own (locked) calls, in this thread's context."""
    context, tm = llvm_cpu._own_llvm()
    mod = llvm.parse_assembly(text, context=context)
    mod.verify()
    llvm_cpu.run_passes(mod, tm, vectorize, speed)
    return tm.emit_object(mod)


@pytest.mark.parametrize("speed,vectorize", LEVELS)
def test_the_object_code_is_llvmlites_at_every_level(monkeypatch, speed, vectorize):
    for text in _kernel_irs(monkeypatch, LEVELS.index((speed, vectorize))):
        assert llvm_cpu.compile_object(text, vectorize, speed) == _through_llvmlite(
            text, speed, vectorize
        )


def test_a_build_finishes_while_another_thread_holds_llvmlites_lock(monkeypatch):
    text = _kernel_irs(monkeypatch, 10)[0]
    holding, release, ready, go, finished = (threading.Event() for _ in range(5))

    def acquired():  # llvmlite calls it with its lock held: the "holder" thread keeps it
        if threading.current_thread().name == "holder" and not release.is_set():
            holding.set()
            release.wait(60)

    def noop():
        pass

    built: list[bytes] = []

    def build():
        llvm_cpu.compile_object(text)  # this thread's context and target machine made first
        ready.set()
        go.wait(60)
        built.append(llvm_cpu.compile_object(text))
        finished.set()  # (the thread's exit frees its LLVM objects under llvmlite's lock)

    builder = threading.Thread(target=build)
    builder.start()
    assert ready.wait(60)
    llvm.ffi.register_lock_callback(acquired, noop)
    holder = threading.Thread(target=llvm.get_host_cpu_name, name="holder")
    try:
        holder.start()
        assert holding.wait(60)
        go.set()
        done = finished.wait(30)
    finally:
        release.set()
        holder.join(60)
        llvm.ffi.unregister_lock_callback(acquired, noop)
        builder.join(60)
    assert done, "the build waited for llvmlite's lock"
    assert built == [_through_llvmlite(text, 3, True)]


def test_bad_ir_is_reported_like_llvmlites(monkeypatch):
    with pytest.raises(RuntimeError, match="LLVM IR parsing error"):
        llvm_cpu.compile_object("define void @f( {", True, 3)
    undominated = (  # parses, fails the verifier
        "define i32 @f(i1 %c) {\nentry:\n  br i1 %c, label %a, label %b\n"
        "a:\n  %x = add i32 1, 2\n  br label %b\nb:\n  ret i32 %x\n}\n"
    )
    with pytest.raises(RuntimeError, match="dominate"):
        llvm_cpu.compile_object(undominated, True, 3)
    text = _kernel_irs(monkeypatch, 11)[0]  # the thread's context still compiles afterwards
    assert llvm_cpu.compile_object(text) == _through_llvmlite(text, 3, True)


def _program(k: int):
    """A small program whose kernels differ by thread (the constant k), and its float64 value."""

    def f(x, w):
        return dq.sum(dq.tanh(x @ w) * (1.0 + 0.25 * k) + dq.exp(-x[:, :8]), axis=1)

    def want(x, w):
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        return (np.tanh(x64 @ w64) * (1.0 + 0.25 * k) + np.exp(-x64[:, :8])).sum(axis=1)

    return f, want


def test_many_threads_compile_programs_at_once(monkeypatch):
    monkeypatch.setattr("dlvm_eq.codegen.runtime.cpu_count.usable_cpus", lambda: 3)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 24)).astype(np.float32)
    w = (rng.standard_normal((24, 8)) * 0.3).astype(np.float32)

    def run(k: int) -> float:
        f, want = _program(100 + k)  # constants no other test compiled
        got = np.asarray(dq.jit(f)(x, w), np.float64)
        return float(np.max(np.abs(got - want(x, w)) / (1 + np.abs(want(x, w)))))

    with ThreadPoolExecutor(8) as pool:
        errors = list(pool.map(run, range(16)))
    assert max(errors) < 1e-5


CHILD = """
import json, sys
import numpy as np
import dlvm_eq as dq
sys.path.insert(0, sys.argv[2])
from test_unlocked_llvm import _program
rng = np.random.default_rng(int(sys.argv[1]))
x = rng.standard_normal((32, 24)).astype(np.float32)
w = (rng.standard_normal((24, 8)) * 0.3).astype(np.float32)
errors = []
for k in range(3):
    f, want = _program(int(sys.argv[1]) * 10 + k)
    got = np.asarray(dq.jit(f)(x, w), np.float64)
    errors.append(float(np.max(np.abs(got - want(x, w)) / (1 + np.abs(want(x, w))))))
from dlvm_eq.codegen.runtime import cpu_kernel
print(json.dumps({"errors": errors, "compiled": cpu_kernel.JIT.counters["compiled"]}))
"""


def test_processes_building_on_threads_start_and_exit(tmp_path):
    """Four processes at once, each building its kernels on four threads in an empty cache of
    its own, exit cleanly (the threads' LLVM contexts freed at exit) with float64 results."""
    here = os.path.dirname(os.path.abspath(__file__))
    procs = []
    for seed in range(4):
        env = dict(
            os.environ,
            DLVM_EQ_NUM_THREADS="4",
            DLVM_EQ_CACHE_DIR=str(tmp_path / f"cache{seed}"),
            OPENBLAS_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", CHILD, str(seed), here],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        row = json.loads(out.strip().splitlines()[-1])
        assert row["compiled"] >= 3 and max(row["errors"]) < 1e-5
