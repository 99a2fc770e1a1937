"""How small kernels are built (llvm_cpu.is_small): math routines called, not inlined
(Emitter.outline), and the CLEANUP pipeline (llvm_cpu.FAMILY_PIPELINE: sroa, instcombine and
simplifycfg, then the -O3 back end). The object code a small kernel runs is that pipeline's and
not O2's; it computes bitwise what the O3 vectorizing, inlining build of the same kernel
computes, for every unary op of the kernel vocabulary; random small programs (every kernel
small) agree with the float64 reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_programs import random_function, random_inputs

from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.cpu import llvm_cpu
from dlvm_eq.codegen.kernels.kernel_spec import KernelInput, KernelSpec, ReduceSpec
from dlvm_eq.codegen.kernels.spec import Load, unary
from dlvm_eq.codegen.llvm.lower_expr import UNARY_LOWER
from dlvm_eq.codegen.runtime.cpu_kernel import CpuKernel
from dlvm_eq.codegen.runtime.jit import JIT
from dlvm_eq.ir import F64, I32, Module, interpret
from dlvm_eq.ir.ops import BINARY, CAST, COMPARE, LOGIC, REDUCE, SELECT, UNARY
from dlvm_eq.pipeline import compile


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _chain(n: int, dtype: str, name: str, depth: int = 6) -> KernelSpec:
    x = Load(0)
    for _ in range(depth):
        x = unary("tanh", x * x + x)
    return KernelSpec(name, (n,), [KernelInput(dtype)], [x, unary("exp", x) - Load(0)])


def test_a_small_kernel_runs_the_cleanup_pipelines_object_code():
    spec = _chain(5, "f32", "cleanup_obj")
    kir = llvm_cpu.cpu_ir(spec)
    assert llvm_cpu.family_pipeline(kir.kind) == (llvm_cpu.CLEANUP, False)
    CpuKernel(spec)
    cleanup = llvm_cpu.compile_object(kir.text, False, llvm_cpu.CLEANUP)
    assert JIT.objects[kir.symbol] == cleanup
    # not O2 under another name: O2 rewrites the loop (rotation, strength reduction)
    assert llvm_cpu.compile_object(kir.text, False, 2) != cleanup


def test_cleanup_turns_a_reductions_accumulator_slot_into_a_register():
    spec = ReduceSpec("s", (1, 7), [KernelInput("f32")], unary("tanh", Load(0)), "add", axes=(1,))
    kir = llvm_cpu.cpu_ir(spec)
    assert kir.kind == "small-reduce" and "alloca" in kir.text
    assert "alloca" not in str(llvm_cpu.optimize(kir.text, False, llvm_cpu.CLEANUP))


@pytest.mark.parametrize("n, dtype", [(1, "f32"), (5, "f32"), (7, "f32"), (3, "f64")])
def test_small_kernels_compute_bitwise_what_the_o3_build_computes(n, dtype, monkeypatch):
    npdt = np.float32 if dtype == "f32" else np.float64
    small = CpuKernel(_chain(n, dtype, f"cleanup_small_{n}"))
    assert llvm_cpu.is_small(small.spec)
    monkeypatch.setattr(llvm_cpu, "is_small", lambda spec: False)  # O3, vectorizers on
    full = CpuKernel(_chain(n, dtype, f"cleanup_o3_{n}"))
    assert full.ir.symbol != small.ir.symbol
    a = np.random.default_rng(n).uniform(-1.5, 1.0, n).astype(npdt)
    for got, want in zip(small(a), full(a)):
        assert np.array_equal(got, want)
    x = a.astype(np.float64)  # and both against float64 numpy
    for _ in range(6):
        x = np.tanh(x * x + x)
    tol = 1e-5 if dtype == "f32" else 1e-12
    np.testing.assert_allclose(small(a)[0], x, rtol=tol, atol=tol * np.abs(x).max())


FLOAT_UNARY = sorted(op for op in UNARY_LOWER if op != "not")  # every other one takes floats


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_every_unary_op_small_is_bitwise_the_inlined_o3_build(dtype, monkeypatch):
    """op(x*1.5 + 0.25) * x + x: the caller's arithmetic on both sides of each call, where
    contraction into FMAs could differ between a call and an inlined body."""
    n = 3 if dtype == "f64" else 7
    npdt = np.float32 if dtype == "f32" else np.float64
    a = np.random.default_rng(5).uniform(0.05, 0.95, n).astype(npdt)  # every op's domain
    specs = {}
    for op in FLOAT_UNARY:
        x = Load(0)
        specs[op] = KernelSpec(
            f"u_{op}", (n,), [KernelInput(dtype)], [unary(op, x * 1.5 + 0.25) * x + x]
        )
    small = {op: CpuKernel(spec) for op, spec in specs.items()}
    assert all(llvm_cpu.is_small(spec) for spec in specs.values())
    monkeypatch.setattr(llvm_cpu, "is_small", lambda spec: False)
    for op, spec in specs.items():
        full = CpuKernel(KernelSpec(f"u_{op}_o3", spec.shape, spec.inputs, spec.outputs))
        got, want = small[op](a), full(a)
        assert np.array_equal(got, want, equal_nan=True), (op, got, want)


KINDS = (UNARY, BINARY, COMPARE, LOGIC, SELECT, REDUCE, CAST)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_random_small_programs_agree_with_the_interpreter(data):
    """f64 vectors of at most 3 elements and i32 ones of at most 7: every kernel is small."""
    dtype = data.draw(st.sampled_from([F64, I32]))
    fn = random_function(
        data.draw,
        n_ops=data.draw(st.integers(1, 16)),
        dtype=dtype,
        kinds=KINDS,
        max_rank=1,
        max_dim=3 if dtype is F64 else 7,
    )
    m = Module("small")
    m.add(fn)
    compiled = compile(m, fn.name, optimize=False)
    args = random_inputs(fn, np.random.default_rng(0))
    got, want = compiled(*args), interpret(m, fn.name, *args)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert g.shape == w.shape, f"{fn}\n{compiled.plan}"
        if w.dtype.kind == "f":
            scale = max(1.0, float(np.abs(w[np.isfinite(w)]).max(initial=0.0)))
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12 * scale, err_msg=str(fn))
        else:
            np.testing.assert_array_equal(g, w, err_msg=str(fn))
