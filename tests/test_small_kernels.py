"""Kernels smaller than one vector (llvm_cpu.is_small) call their math routines and compile
through the CLEANUP passes without the vectorizers: right results against float64 numpy, and
object code that never stands in for a large kernel's of the same spec (their symbols differ)."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen.cpu import llvm_cpu
from dlvm_eq.codegen.kernels.kernel_spec import KernelInput, KernelSpec, ReduceSpec
from dlvm_eq.codegen.kernels.spec import Load, unary
from dlvm_eq.codegen.runtime.cpu_kernel import CpuKernel


def _chain(n: int, dtype: str, depth: int = 5) -> KernelSpec:
    x = Load(0)
    for _ in range(depth):
        x = unary("tanh", x * x + x)
    return KernelSpec("chain", (n,), [KernelInput(dtype)], [x])


def _chain_np(a: np.ndarray, depth: int = 5) -> np.ndarray:
    x = a.astype(np.float64)
    for _ in range(depth):
        x = np.tanh(x * x + x)
    return x


@pytest.mark.parametrize(
    "n, dtype, small",
    [(7, "f32", True), (8, "f32", False), (3, "f64", True), (4, "f64", False), (1, "i32", True)],
)
def test_small_means_under_one_256_bit_vector(n, dtype, small):
    spec = KernelSpec("k", (n,), [KernelInput(dtype)], [Load(0) + Load(0)])
    assert llvm_cpu.is_small(spec) is small
    kir = llvm_cpu.cpu_ir(spec)
    assert kir.kind == ("small-map" if small else "map")
    assert kir.text.startswith(llvm_cpu.SMALL_HEADER) is small
    assert llvm_cpu.family_pipeline(kir.kind) == ((llvm_cpu.CLEANUP, False) if small else (3, True))


def test_a_reduction_counts_its_input_shape_and_widest_dtype():
    def red(shape, dtype):
        return ReduceSpec("s", shape, [KernelInput(dtype)], Load(0), "add", axes=(1,))

    assert llvm_cpu.is_small(red((2, 3), "f32"))  # 6 elements iterated, 24 bytes
    assert not llvm_cpu.is_small(red((2, 3), "f64"))  # 48 bytes
    assert not llvm_cpu.is_small(red((2, 4), "f32"))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_small_and_large_kernels_of_one_body_are_distinct_and_right(dtype):
    npdt = np.float32 if dtype == "f32" else np.float64
    small_spec, big_spec = _chain(3, dtype), _chain(64, dtype)
    small_ir, big_ir = llvm_cpu.cpu_ir(small_spec), llvm_cpu.cpu_ir(big_spec)
    # the small kernel calls its math routines (Emitter.outline); the large one inlines them
    assert small_ir.text.startswith(llvm_cpu.SMALL_HEADER)
    assert small_ir.text.count(f'@"dq.tanh.{dtype}"(') == 5 + 1  # 5 calls, 1 definition
    assert "dq.tanh" not in big_ir.text
    assert small_ir.symbol != big_ir.symbol
    rng = np.random.default_rng(0)
    for spec, n in ((small_spec, 3), (big_spec, 64)):
        a = rng.uniform(-1.5, 1.0, n).astype(npdt)
        got = CpuKernel(spec)(a)
        want = _chain_np(a)
        tol = 1e-5 if dtype == "f32" else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_tanh_chain_gradient_on_six_floats_against_float64():
    depth = 12

    def deep(x):
        for _ in range(depth):
            x = dq.tanh(x * x + x)
        return dq.sum(x)

    a = np.linspace(-0.9, 0.7, 6).astype(np.float32)
    got = dq.jit(dq.grad(deep))(a)
    x, g = a.astype(np.float64), np.ones(6)
    for _ in range(depth):  # d tanh(x^2 + x)/dx = (1 - tanh^2)(2x + 1)
        y = np.tanh(x * x + x)
        g, x = g * (1 - y * y) * (2 * x + 1), y
    np.testing.assert_allclose(got, g, rtol=1e-4, atol=1e-5 * np.abs(g).max())
