"""Deterministic numerics: a compiled kernel computes the same bits for the same input
whatever the element's position (vector body, vectorized epilogue or scalar remainder of a
loop), the thread count, or the load on the machine.

- every float unary op, the binary ops and fused chains: one value repeated, every sub-range
  [lo, hi) of many offsets and lengths 1..70 gives the bits that one element alone gives;
- row kernels (softmax, logsumexp, layernorm) on constant rows of lengths 1..70: every
  element of a row equal;
- reductions, row kernels and our GEMM with 1, 2, 3, 5 and 8 threads: bitwise equal; a whole
  reduction-heavy program (sums, means, softmax, products through our GEMM) with 1, 2 and 5
  threads, on one CPU (`taskset -c 0`) and while a busy process spins: bitwise equal.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.cpu_runtime import CpuKernel, data_ptr
from dlvm_eq.codegen.kernel import (DTYPES, UNARY_OPS, KernelInput, KernelSpec, Load, ReduceSpec, binary,
                                    unary)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _bits(a: np.ndarray) -> np.ndarray:
    """The bit patterns, every NaN as one pattern: a NaN's sign and payload are not results (x86
    propagates the first operand's NaN, and LLVM may commute a product's operands per width)."""
    a = np.asarray(a)
    bits = a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint64).copy()
    bits[np.isnan(a)] = np.asarray(np.nan, a.dtype).view(bits.dtype)
    return bits


# Values that reach every branch of the polynomial math: tiny, small (series), around the
# switch points (0.5, 0.625, 1), large (saturation, overflow), negative, special.
PROBES = [0.0, -0.0, 1e-30, 3e-4, 0.1, -0.3, 0.49, 0.55, 0.7, -1.5, 2.5, 7.0, 9.4, 9.6, 15.0,
          25.0, -25.0, 60.0, 88.5, -100.0, 700.0, np.inf, -np.inf, np.nan]
OFFSETS = [0, 1, 3, 7, 8, 13, 16]
SIZE = 96        # OFFSETS[-1] + 70 < SIZE


def _assert_position_independent(k: CpuKernel, dtype, probes=PROBES, n_in=1):
    """For each probe: the kernel on every [lo, lo + n) (n = 1..70) writes, at every element,
    the bits it writes for that value computed alone."""
    out = np.empty(SIZE, dtype)
    for p in probes:
        x = np.full(SIZE, p, dtype)
        ptrs = [data_ptr(out)] + [data_ptr(x)] * n_in + [k._dims_ptr]
        k._fn(0, 1, *ptrs)
        want = _bits(out)[0]
        for lo in OFFSETS:
            for n in range(1, 71):
                out.fill(np.nan)
                k._fn(lo, lo + n, *ptrs)
                got = _bits(out)[lo:lo + n]
                assert (got == want).all(), (
                    f"{k.spec.name} at {p!r} ({np.dtype(dtype).name}): [{lo}, {lo + n}) gives "
                    f"{out[lo:lo + n][got != want][:3]} at positions {np.flatnonzero(got != want)[:5] + lo}, "
                    f"alone {out.dtype.type(np.frombuffer(want.tobytes(), dtype)[0])}")


FLOAT_UNARY = sorted(op for op, dts in UNARY_OPS.items() if "f32" in dts)


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("op", FLOAT_UNARY)
def test_unary_op_gives_the_same_bits_at_every_position(op, dt):
    spec = KernelSpec(f"u_{op}", (SIZE,), [KernelInput(dt)], [unary(op, Load(0))])
    _assert_position_independent(CpuKernel(spec, threads=1), DTYPES[dt])


FUSED = {
    "sigmoid_chain": lambda x: unary("sigmoid", x * 1.5 + 0.25) * x,
    "tanh_fma": lambda x: unary("tanh", x) * x + 1.0,
    "div": lambda x: binary("div", 1.0, x + 3.0),
    "pow": lambda x: binary("pow", unary("abs", x) + 0.5, x * 0.1),
    "exp_log": lambda x: unary("log", unary("exp", x * 0.01) + x * x),
    "softplus_expm1": lambda x: unary("softplus", x) - unary("expm1", x * 0.01),
    "rsqrt_sqrt": lambda x: unary("rsqrt", x * x + 1.0) + unary("sqrt", unary("abs", x)),
    "min_max": lambda x: binary("max", binary("min", x, 3.0), -2.0) * 0.5,
}


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_chain_gives_the_same_bits_at_every_position(name, dt):
    spec = KernelSpec(f"c_{name}", (SIZE,), [KernelInput(dt)], [FUSED[name](Load(0))])
    _assert_position_independent(CpuKernel(spec, threads=1), DTYPES[dt])


@pytest.mark.parametrize("n", [1, 4, 15, 16, 17, 20, 33, 64, 70])
def test_jitted_sigmoid_of_one_repeated_value_is_one_value(n):
    """The issue's example: dq.jit(dq.sigmoid) on np.full(20, 25) gave 16 x 1.0, 4 x 0.99999994."""
    for f in (dq.sigmoid, dq.exp, dq.tanh, dq.log):
        for v in (25.0, 0.3, 3.0):
            y = dq.jit(f)(np.full(n, v, np.float32))
            assert (_bits(y) == _bits(y)[0]).all(), (f.__name__, v, n, y)
