"""Kernels build in parallel, each thread in its own LLVM context: the object code is bitwise
what the serial build in LLVM's global context gives, whatever the thread count."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen.cpu import llvm_cpu
from dlvm_eq.codegen.planning.plan import KernelStep
from dlvm_eq.codegen.runtime import kernel_memo


def _kernel_irs() -> list[tuple[str, bool]]:
    """The LLVM IR of a program's map and reduction kernels."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 16))
    m = dq.make_ir(
        lambda x, w: (
            dq.sum(dq.tanh(x @ w.astype(np.float32)) * dq.exp(-x[:, :16]), axis=1)
            + dq.max(dq.sigmoid(x), axis=1)
        )
    )(x, w)
    plan = dq.compile(m, next(iter(m.functions))).plan
    specs = [s.spec for s in plan.steps if isinstance(s, KernelStep)]
    assert len(specs) >= 2
    return [(llvm_cpu.cpu_ir(spec).text, True) for spec in specs]


def _serial_global(text: str, vectorize: bool) -> bytes:
    """The build in LLVM's global context, under its lock (what every build was before)."""
    mod = llvm_cpu.optimize(text, vectorize)
    with llvm_cpu.LLVM_LOCK:
        return llvm_cpu.target_machine().emit_object(mod)


def test_threads_build_bitwise_the_serial_object_code():
    irs = _kernel_irs() * 3
    serial = [_serial_global(t, v) for t, v in irs]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda tv: llvm_cpu.compile_object(*tv), irs))
    assert parallel == serial


def test_build_all_keeps_the_order_and_uses_threads(monkeypatch):
    monkeypatch.setattr("dlvm_eq.codegen.runtime.cpu_count.usable_cpus", lambda: 4)
    seen = []
    meet = threading.Barrier(2, timeout=60)  # passed only by two builds running at once

    def meeting(i):
        def run():
            seen.append(threading.get_ident())
            meet.wait()
            return i * i

        return run

    def plain(i):
        return lambda: seen.append(threading.get_ident()) or i * i

    assert kernel_memo.build_all([meeting(i) for i in range(8)]) == [i * i for i in range(8)]
    assert threading.get_ident() in seen and len(set(seen)) > 1  # the caller builds too
    monkeypatch.setattr("dlvm_eq.codegen.runtime.cpu_count.usable_cpus", lambda: 1)
    seen.clear()
    assert kernel_memo.build_all([plain(i) for i in range(3)]) == [0, 1, 4]
    assert set(seen) == {threading.get_ident()}


def test_build_all_raises_the_first_failure_after_every_build_ran(monkeypatch):
    monkeypatch.setattr("dlvm_eq.codegen.runtime.cpu_count.usable_cpus", lambda: 2)
    ran = []

    def build(i):
        def run():
            ran.append(i)
            if i in (2, 4):
                raise ValueError(f"build {i}")
            return i

        return run

    with pytest.raises(ValueError, match="build 2"):
        kernel_memo.build_all([build(i) for i in range(6)])
    assert sorted(ran) == list(range(6))
