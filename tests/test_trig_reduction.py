"""Trigonometry of large arguments (issue 31, bug 2): the generated sin/cos/tan reduce |x| >= 2**20
by Payne-Hanek (codegen/llvm/payne_hanek.py) instead of Cody-Waite alone, which gave values
outside [-1, 1] and inf for |x| >~ 1e18. Checked against numpy (float64, correctly reduced) on
the cpu target and the emulated gpu target (PTX assembled by ptxas, launches run on the host),
for f32 and f64, over magnitudes up to the largest finite value."""

from __future__ import annotations

import math
import shutil
import subprocess

import fake_cupy
import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen import KernelInput, KernelSpec, Load, ptx_kernel, set_cache_dir, unary
from dlvm_eq.codegen.llvm.payne_hanek import (
    F32_CHUNKS,
    F32_EXPONENTS,
    f32_table,
    two_over_pi_chunks,
)

OPS = ("sin", "cos", "tan")
PTXAS = shutil.which("ptxas")


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def large_arguments(dtype, n, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    top = np.log10(np.finfo(dtype).max)
    x = 10.0 ** rng.uniform(-2, top, n) * rng.choice([-1.0, 1.0], n)
    special = [1e18, -1e18, 1e22, 2.0**20, np.nextafter(2.0**20, 0), 2.0**20 * np.pi]
    special += [np.finfo(dtype).max, -np.finfo(dtype).max, 0.0, -0.0, np.inf, -np.inf, np.nan]
    return np.concatenate([x, special]).astype(dtype)


def assert_trig_matches_numpy(got, x, op):
    with np.errstate(invalid="ignore"):  # sin(inf) is NaN
        want = getattr(np, op)(x.astype(np.float64))
    got = np.asarray(got)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = np.isfinite(want)
    if op != "tan":
        assert np.all(np.abs(got[ok]) <= 1.0)
    # 4 ulp of the result in its own precision (tan near a pole: 4 ulp relative all the same)
    eps = np.finfo(x.dtype).eps
    want_rounded = want[ok].astype(x.dtype).astype(np.float64)
    np.testing.assert_allclose(
        got[ok].astype(np.float64), want_rounded, rtol=4 * eps, atol=4 * np.finfo(x.dtype).tiny
    )


def test_two_over_pi_chunks_are_fdlibms():
    # fdlibm's ipio2 (e_rem_pio2.c) begins with these 24-bit chunks of 2/pi
    assert two_over_pi_chunks(6) == (0xA2F983, 0x6E4E44, 0x1529FC, 0x2757D1, 0xF534DD, 0xC0DB62)


def test_f32_rows_are_two_over_pi_scaled_mod_4_in_exact_pieces():
    """Row e: (2/pi 2**(e-23)) mod 4 in 29-bit pieces, so a 24-bit mantissa times a piece is
    exact; checked in exact rationals against 2/pi to 1200 bits."""
    from fractions import Fraction

    two_over_pi = Fraction(0)
    for k, c in enumerate(two_over_pi_chunks()):
        two_over_pi += Fraction(c, 2 ** (24 * (k + 1)))
    table = f32_table()
    for row, ex in enumerate(F32_EXPONENTS):
        pieces = table[row * F32_CHUNKS : (row + 1) * F32_CHUNKS]
        want = (two_over_pi * Fraction(2) ** (ex - 23)) % 4
        assert 0 <= want - sum(Fraction(p) for p in pieces) < Fraction(2) ** (2 - F32_CHUNKS * 29)
        for p in pieces:
            mantissa = Fraction(p) / Fraction(2) ** (math.frexp(p)[1] - 29) if p else 0
            assert mantissa == int(mantissa)  # at most 29 significant bits


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", OPS)
def test_cpu_trig_of_large_arguments_matches_numpy(op, dtype):
    x = large_arguments(dtype, 3000)
    assert_trig_matches_numpy(dq.jit(getattr(dq, op), target="cpu")(x), x, op)


def test_the_reported_case_stays_in_range():
    x = np.array([1e18, 3e18, 1e19, 1e30, 3.0e38], np.float32)
    for op in ("sin", "cos"):
        got = dq.jit(getattr(dq, op), target="cpu")(x)
        assert np.all(np.abs(got) <= 1.0), (op, got)
        np.testing.assert_allclose(got, getattr(np, op)(x.astype(np.float64)), atol=1e-7)


@pytest.mark.skipif(PTXAS is None, reason="ptxas is not on PATH")
@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_trig_ptx_with_its_table_assembles(dt, arch, tmp_path):
    spec = KernelSpec(f"trig_{dt}", (100,), [KernelInput(dt)], [unary(op, Load(0)) for op in OPS])
    kp = ptx_kernel(spec, arch)
    table = "dlvm_eq_two_over_pi_f32[" if dt == "f32" else "dlvm_eq_two_over_pi["
    assert f".global .align 8 .b8 {table}" in kp.ptx  # one table in global memory
    src = tmp_path / "k.ptx"
    src.write_text(kp.ptx)
    r = subprocess.run(
        [PTXAS, f"-arch={arch}", str(src), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_emulated_gpu_trig_of_large_arguments_matches_numpy(monkeypatch, dtype):
    x = large_arguments(dtype, 120, seed=1)
    with fake_cupy.installed(monkeypatch, sms=1) as cp:
        f = dq.jit(lambda x: (dq.sin(x), dq.cos(x), dq.tan(x)), target="gpu")
        outs = f(cp.asarray(x))
        for op, got in zip(OPS, outs):
            assert_trig_matches_numpy(got.get(), x, op)
