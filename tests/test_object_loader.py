"""Kernels loaded without LLVM (codegen/runtime/object_loader.py) compute bit for bit what the
same object code loaded by MCJIT computes, and what numpy computes in float64 (to rounding); an
object the loader cannot relocate falls back to MCJIT; code pages are never writable; the host
key read from the disk cache is LLVM's own."""

import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlvm_eq import cache
from dlvm_eq.cache import DiskCache
from dlvm_eq.codegen import KernelInput, KernelSpec, Load, ReduceSpec, unary
from dlvm_eq.codegen.kernels.layout import spec_layout
from dlvm_eq.codegen.runtime import cpu_kernel, jit, object_loader

pytestmark = pytest.mark.skipif(not object_loader.supported(), reason="x86-64 Linux only")

RNG = np.random.default_rng(0)


@pytest.fixture
def own_cache(tmp_path):
    old = cache.shared_cache().root
    cache.set_cache_dir(tmp_path)
    yield tmp_path
    cache.set_cache_dir(old)


def _kernels(spec, monkeypatch):
    """The kernel of `spec` twice, each from a fresh `Jit`: loaded natively (compiled), then
    by MCJIT (the same object, read from the disk cache)."""
    native = jit.Jit()
    monkeypatch.setattr(cpu_kernel, "JIT", native)
    k_native = cpu_kernel.CpuKernel(spec, threads=1)
    assert native.counters["loaded_natively"] == 1 and native.engine is None
    mcjit = jit.Jit()
    monkeypatch.setattr(cpu_kernel, "JIT", mcjit)
    monkeypatch.setattr(jit.object_loader, "supported", lambda: False)
    k_mcjit = cpu_kernel.CpuKernel(spec, threads=1)
    assert mcjit.counters["loaded_from_disk"] == 1 and mcjit.counters["loaded_natively"] == 0
    assert mcjit.engine is not None
    assert native.objects == mcjit.objects  # the same object code, loaded two ways
    return k_native, k_mcjit


UNARIES = ("tanh", "exp", "sin", "cos", "sigmoid", "cosh")
F64 = {"tanh": np.tanh, "exp": np.exp, "sin": np.sin, "cos": np.cos, "cosh": np.cosh}
F64["sigmoid"] = lambda v: 1 / (1 + np.exp(-v))


@st.composite
def expressions(draw, depth=3):
    """(kernel expression over two inputs, its float64 numpy twin)."""
    if depth == 0 or draw(st.booleans()):
        i = draw(st.integers(0, 1))
        return Load(i), lambda xs, i=i: xs[i]
    kind = draw(st.sampled_from(("unary", "add", "mul", "const")))
    a, fa = draw(expressions(depth=depth - 1))
    if kind == "unary":
        op = draw(st.sampled_from(UNARIES))
        return unary(op, a), lambda xs: F64[op](fa(xs))
    if kind == "const":
        c = draw(st.sampled_from((0.5, -1.25, 3.0)))
        return a * c, lambda xs: fa(xs) * c
    b, fb = draw(expressions(depth=depth - 1))
    if kind == "add":
        return a + b, lambda xs: fa(xs) + fb(xs)
    return a * b, lambda xs: fa(xs) * fb(xs)


@settings(max_examples=15, deadline=None)
@given(expressions(), st.sampled_from((1, 7, 64, 301)))
def test_native_and_mcjit_loads_agree_bitwise(expr_fn, n):
    expr, reference = expr_fn
    spec = KernelSpec("h", (n,), [KernelInput("f32"), KernelInput("f32")], [expr * 1.0])
    xs = [RNG.uniform(-1, 1, n).astype(np.float32) for _ in range(2)]
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory(prefix="s16-ld-") as d:
        old = cache.shared_cache().root
        cache.set_cache_dir(d)
        try:
            k_native, k_mcjit = _kernels(spec, mp)
            got, again = k_native(*xs), k_mcjit(*xs)
        finally:
            cache.set_cache_dir(old)
    assert got.tobytes() == again.tobytes()
    want = reference([x.astype(np.float64) for x in xs]) * np.ones(n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(np.abs(want).max(), 1.0))


def test_a_reduction_and_its_constants_load_natively(own_cache, monkeypatch):
    x = RNG.uniform(-2, 2, (9, 33)).astype(np.float32)
    spec = ReduceSpec(
        "r", x.shape, [KernelInput("f32")], unary("tanh", Load(0)) * 0.25, "max", (1,)
    )
    k_native, k_mcjit = _kernels(spec, monkeypatch)
    got = k_native(x)
    assert got.tobytes() == k_mcjit(x).tobytes()
    np.testing.assert_allclose(got, (np.tanh(x.astype(np.float64)) * 0.25).max(axis=1), rtol=1e-6)


def _maps_entry(address: int) -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
            if lo <= address < hi:
                return line.split()[1]
    raise AssertionError(f"{address:#x} is not mapped")


def test_code_pages_are_executable_and_never_writable(own_cache, monkeypatch):
    spec = KernelSpec("p", (16,), [KernelInput("f32")], [unary("exp", Load(0)) + 2.0])
    native = jit.Jit()
    monkeypatch.setattr(cpu_kernel, "JIT", native)
    k = cpu_kernel.CpuKernel(spec, threads=1)
    assert _maps_entry(k.address) == "r-xp"
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    np.testing.assert_allclose(k(x), np.exp(x.astype(np.float64)) + 2, rtol=1e-6)


def _object(spec):
    from dlvm_eq.codegen.cpu.llvm_cpu import compile_object, cpu_ir

    kir = cpu_ir(spec)
    return kir.symbol, compile_object(kir.text)


def _with_relocation_type(obj: bytes, new_type: int) -> bytes:
    """`obj` with its first RELA entry's type replaced (a relocation the loader does not do)."""
    data = bytearray(obj)
    (shoff,) = struct.unpack_from("<Q", obj, 40)
    (shnum,) = struct.unpack_from("<H", obj, 60)
    for i in range(shnum):
        _, kind, _, _, off, size, *_ = struct.unpack_from("<IIQQQQIIQQ", obj, shoff + 64 * i)
        if kind == 4 and size:
            _, info = struct.unpack_from("<QQ", obj, off)
            struct.pack_into("<Q", data, off + 8, (info >> 32) << 32 | new_type)
            return bytes(data)
    raise AssertionError("no relocation")


def test_what_the_loader_cannot_relocate_goes_to_mcjit(monkeypatch):
    spec = KernelSpec("f", (8,), [KernelInput("f32")], [unary("tanh", Load(0)) * 0.5])
    symbol, obj = _object(spec)
    with pytest.raises(object_loader.Unsupported, match="relocation type 10"):
        object_loader.load(_with_relocation_type(obj, 10), symbol)  # R_X86_64_32
    with pytest.raises(object_loader.Unsupported, match="not defined"):
        object_loader.load(obj, "dq_no_such_symbol")
    with pytest.raises(object_loader.Unsupported):
        object_loader.load(obj[:200], symbol)

    def refuse(obj, symbol):
        raise object_loader.Unsupported("for the test")

    fresh = jit.Jit()
    monkeypatch.setattr(jit.object_loader, "load", refuse)
    address = fresh._load(obj, symbol)
    assert fresh.engine is not None and fresh.counters["loaded_natively"] == 0
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    out = np.empty_like(x)
    # a map kernel's entry: (start, stop, out, in, dims) as in CpuKernel.run_map
    dims = spec_layout(spec).dims_array()
    proto = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, *[ctypes.c_void_p] * 3)
    proto(address)(0, 8, out.ctypes.data, x.ctypes.data, dims.ctypes.data)
    np.testing.assert_allclose(out, np.tanh(x.astype(np.float64)) * 0.5, rtol=1e-6)


HOST_CHILD = textwrap.dedent("""
    import json, sys
    from dlvm_eq.codegen.runtime import jit
    key = jit.host_key()
    print(json.dumps({"key": key, "llvm": "llvmlite.binding" in sys.modules}))
""")


def _host_child(cache_dir) -> dict:
    env = dict(os.environ, DLVM_EQ_CACHE_DIR=str(cache_dir))
    r = subprocess.run(
        [sys.executable, "-c", HOST_CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_recorded_host_key_is_llvms_and_a_bad_record_is_recomputed(tmp_path):
    first = _host_child(tmp_path)
    assert first["llvm"]  # computed by LLVM, then recorded
    again = _host_child(tmp_path)
    assert again == {"key": first["key"], "llvm": False}
    from dlvm_eq.codegen.cpu.llvm_cpu import host_key

    assert first["key"] == host_key()  # the code generator's own key
    (entry,) = (tmp_path / "host").rglob("*.bin")
    for bad in (b"not JSON", json.dumps({"triple": "x", "key": "x|y|z|0.0"}).encode()):
        DiskCache(tmp_path).put("host", entry.stem, bad)
        assert _host_child(tmp_path) == {"key": first["key"], "llvm": True}
