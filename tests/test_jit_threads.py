"""Threads asking the kernel loader (codegen/runtime/jit.py) for one kernel at once compile it
once: the others wait for the first build and take its result; a failed build leaves the
kernel to the next asker; kernels of other specs still build side by side."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dlvm_eq import cache
from dlvm_eq.codegen import KernelInput, KernelSpec, Load, unary
from dlvm_eq.codegen.kernels.layout import spec_layout
from dlvm_eq.codegen.runtime import jit

THREADS = 6


@pytest.fixture
def own_cache(tmp_path):
    old = cache.shared_cache().root
    cache.set_cache_dir(tmp_path)
    yield tmp_path
    cache.set_cache_dir(old)


@pytest.fixture
def builds(monkeypatch):
    """Counts LLVM builds (compile_object calls) by IR symbol; each build is slowed so that
    every thread asks while the first is still compiling."""
    counted: list[str] = []
    real = jit.compile_object

    def slow_compile(text, *args):
        counted.append(text)
        time.sleep(0.3)
        return real(text, *args)

    monkeypatch.setattr(jit, "compile_object", slow_compile)
    return counted


def _spec(name: str, scale: float) -> KernelSpec:
    return KernelSpec(name, (8,), [KernelInput("f32")], [unary("tanh", Load(0)) * scale])


def _ask_together(loader: jit.Jit, specs) -> list:
    """Each spec asked for by its own thread, all released at once: the KernelCodes (or errors)."""
    start = threading.Barrier(len(specs))
    out: list = [None] * len(specs)

    def ask(i, spec):
        start.wait()
        try:
            out[i] = loader.kernel("map", spec, lambda: jit.cpu_ir(spec), spec_layout(spec))
        except Exception as e:
            out[i] = e

    threads = [threading.Thread(target=ask, args=(i, s)) for i, s in enumerate(specs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread still waits"
    return out


def _runs(code, scale: float) -> None:
    import ctypes

    x = np.linspace(-2, 2, 8, dtype=np.float32)
    out = np.empty_like(x)
    dims = spec_layout(_spec("d", scale)).dims_array()
    proto = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, *[ctypes.c_void_p] * 3)
    proto(code.address)(0, 8, out.ctypes.data, x.ctypes.data, dims.ctypes.data)
    np.testing.assert_allclose(out, np.tanh(x.astype(np.float64)) * scale, rtol=1e-6)


def test_threads_asking_for_one_kernel_compile_it_once(own_cache, builds):
    loader = jit.Jit()
    codes = _ask_together(loader, [_spec("same", 0.5)] * THREADS)
    assert len(builds) == 1, f"{len(builds)} LLVM builds of one kernel"
    assert loader.counters["compiled"] == 1
    assert loader.counters["memory_hits"] == THREADS - 1
    assert len({c.address for c in codes}) == 1
    assert not loader.building  # nothing left waiting
    _runs(codes[0], 0.5)


def test_threads_asking_for_other_kernels_build_each(own_cache, builds):
    loader = jit.Jit()
    scales = [0.5 + i for i in range(3)]
    codes = _ask_together(loader, [_spec(f"k{i}", s) for i, s in enumerate(scales)] * 2)
    assert len(builds) == 3 and loader.counters["compiled"] == 3
    for code, scale in zip(codes, scales * 2):
        _runs(code, scale)


def test_a_failed_build_leaves_the_kernel_to_the_next_asker(own_cache, monkeypatch, builds):
    loader = jit.Jit()
    failures = iter([True])

    def build_once_failing(spec):
        if next(failures, False):
            time.sleep(0.3)  # the others are waiting by now
            raise RuntimeError("the first build fails")
        return jit.cpu_ir(spec)

    spec = _spec("flaky", 2.0)
    start = threading.Barrier(THREADS)
    out: list = [None] * THREADS

    def ask(i):
        start.wait()
        try:
            out[i] = loader.kernel("map", spec, lambda: build_once_failing(spec))
        except RuntimeError as e:
            out[i] = e

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    errors = [o for o in out if isinstance(o, Exception)]
    assert len(errors) == 1 and "fails" in str(errors[0])
    assert len(builds) == 1  # the next asker built it; the rest took it from memory
    assert len({o.address for o in out if not isinstance(o, Exception)}) == 1
    assert not loader.building
