"""erf end to end: the compiled polynomial against float64 scipy (an ulp bound over a dense grid,
tails and special values; mpmath's correctly rounded values), the interpreter, eager calls, the adjoint rule 2/sqrt(pi) exp(-x^2)
(exact under sympy, and central differences through an exact GELU), and its PTX.
(tests/test_codegen_kernels.py and test_codegen_ptx.py cover erf with every other unary op.)"""

from __future__ import annotations

import math
import shutil
import subprocess

import numpy as np
import pytest
from scipy.special import erf as scipy_erf

import dlvm_eq as dq
from dlvm_eq.codegen import KernelInput, KernelSpec, Load, compile_cpu, ptx_kernel, unary
from dlvm_eq.pipeline import check_grads
from dlvm_eq.verify import verify_gradient

SPECIAL = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-310, -1e-310, 1e-30, 5.9, 6.0, 6.1, 1e300]
)


def _grid():
    rng = np.random.default_rng(0)
    return np.concatenate(
        [
            np.linspace(-7, 7, 20001),
            rng.normal(0, 2, 5000),
            np.exp(rng.uniform(-40, 2, 3000)) * rng.choice([-1, 1], 3000),
            0.75 + np.linspace(-1e-6, 1e-6, 101),
            SPECIAL,
        ]
    )  # across the split


def _exact_erf(x):
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(30):
        return np.array([float(mpmath.erf(v)) if np.isfinite(v) else scipy_erf(v) for v in x])


def _ulps(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    return np.where(same, 0.0, np.abs(got - want) / np.spacing(np.abs(want).astype(want.dtype)))


@pytest.mark.parametrize("dt, bound", [(np.float64, 1.0), (np.float32, 1.0)])
def test_compiled_erf_is_within_ulps_of_float64(dt, bound):
    with np.errstate(over="ignore"):  # 1e300 is inf in f32
        x = _grid().astype(dt)
    got = compile_cpu(
        KernelSpec(
            "erf",
            x.shape,
            [KernelInput(np.dtype(dt).name.replace("float", "f"))],
            [unary("erf", Load(0))],
        )
    )(x)
    want = _exact_erf(x.astype(np.float64)).astype(dt)  # correctly rounded (scipy's is 2 ulp off)
    assert np.nanmax(_ulps(got, want)) <= bound
    assert (
        np.isnan(got[np.isnan(x)]).all()
        and np.signbit(got[x == 0]).tolist() == np.signbit(x[x == 0]).tolist()
    )


def test_erf_in_the_dsl_interpreter_and_compiled():
    x = np.linspace(-4, 4, 33)
    np.testing.assert_allclose(dq.jit(dq.erf, target="interp")(x), scipy_erf(x), rtol=1e-15)
    np.testing.assert_allclose(
        dq.jit(dq.erf)(x.astype(np.float32)), scipy_erf(x), rtol=2e-7, atol=1e-7
    )
    np.testing.assert_allclose(dq.erf(np.array([0.5], np.float32)), [math.erf(0.5)], rtol=1e-7)
    assert dq.jit(dq.erf)(np.arange(3, dtype=np.int32)).dtype == np.float32  # ints promote


def _gelu(x):
    return 0.5 * x * (1.0 + dq.erf(x * (1.0 / math.sqrt(2.0))))


def test_gradient_of_exact_gelu_matches_central_differences():
    x = np.random.default_rng(1).normal(0, 1.5, (3, 5))
    checks = check_grads(lambda x: dq.sum(_gelu(x) ** 2), (x,), order=2, rtol=1e-5, atol=1e-7)
    assert [c.order for c in checks] == [1, 2]
    g = dq.jit(dq.grad(lambda x: dq.sum(_gelu(x))))(x.astype(np.float32))
    cdf = 0.5 * (1 + scipy_erf(x / math.sqrt(2)))
    np.testing.assert_allclose(
        g, cdf + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi), rtol=1e-5, atol=1e-6
    )


def test_adjoint_rule_is_exact_under_sympy():
    # f64: in f32 the constant 2/sqrt(pi) is rounded (numerically equal, not exact)
    report = verify_gradient(lambda x: dq.sum(dq.erf(x) * x), [(2,)], dtype="f64")
    assert report.exact, str(report)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
def test_erf_ptx_assembles(tmp_path):
    for dt in ("f32", "f64"):
        k = ptx_kernel(
            KernelSpec(f"erf_{dt}", (64,), [KernelInput(dt)], [unary("erf", Load(0))]), "sm_90"
        )
        path = tmp_path / f"erf_{dt}.ptx"
        path.write_text(k.ptx)
        subprocess.run(
            ["ptxas", "-arch=sm_90", str(path), "-o", str(tmp_path / "k.cubin")],
            check=True,
            timeout=60,
            capture_output=True,
        )
