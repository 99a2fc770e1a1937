"""Tiling from the profile (issue 36): our GEMM's cache blocking (kc, mc) comes from the
calibrated profile (`gemm_blocks`, timed by `calibration.measure.gemm_blocks` over
alternatives), the shipped blocks of gemm_tiles.py where there is none. A profile with other
blocks changes the kernel generated; the results stay those of numpy and the interpreter."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_calibration import cache_dir, sample_profile  # noqa: F401  (a fixture)

import dlvm_eq as dq
from dlvm_eq.calibration import measure
from dlvm_eq.codegen.runtime import batch_gemm, gemm_runtime
from dlvm_eq.extract.profile import Profile, ProfileError, write_profile

OTHER = {"kc": 128, "mc": 100}  # mc is rounded up to a multiple of the micro-tile's rows


@pytest.fixture
def shipped_blocks_after():
    yield
    batch_gemm.use_blocks(None)
    assert gemm_runtime.WIDE == gemm_runtime.HOST_WIDE


def test_profile_keeps_its_gemm_blocks():
    p = sample_profile(gemm_blocks={"kc": 128, "mc": 96})
    assert Profile.from_json(p.to_json()) == p
    assert Profile.from_json(sample_profile().to_json()).gemm_blocks == {}


@pytest.mark.parametrize(
    "blocks", [{"kc": 0, "mc": 96}, {"kc": 128}, {"kc": 128, "mc": 96.5}, {"kc": 1 << 20, "mc": 96}]
)
def test_malformed_gemm_blocks_are_refused(blocks):
    data = json.loads(sample_profile().to_json())
    data["gemm_blocks"] = blocks
    with pytest.raises(ProfileError):
        Profile.from_json(json.dumps(data))


def test_other_blocks_generate_another_kernel_with_equal_results(shipped_blocks_after):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 700), dtype=np.float32)
    b = rng.standard_normal((700, 90), dtype=np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    shipped = gemm_runtime.shared_gemm(False)
    out0 = np.empty((300, 90), np.float32)
    shipped(a, b, out0)
    assert batch_gemm.use_blocks(OTHER) is None and gemm_runtime.WIDE["kc"] == 128
    other = gemm_runtime.shared_gemm(False)
    mr = gemm_runtime.HOST_WIDE["mr"]
    assert (other.spec.kc, other.spec.mc) == (128, -(-100 // mr) * mr)
    assert other.spec != shipped.spec and other.address != shipped.address
    out1 = np.empty((300, 90), np.float32)
    other(a, b, out1)
    np.testing.assert_allclose(out1, want, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(out0, want, rtol=1e-4, atol=1e-3)
    # the same blocks again change nothing; the shipped ones bring the shipped kernel back
    assert not gemm_runtime.use_blocks(OTHER)
    assert gemm_runtime.use_blocks(None) and gemm_runtime.shared_gemm(False).spec == shipped.spec


def test_a_profiles_blocks_reach_the_compiled_program(cache_dir, monkeypatch, shipped_blocks_after):
    monkeypatch.setattr(gemm_runtime, "_ENABLED", True)  # our GEMM, not numpy's BLAS
    write_profile(sample_profile(gemm_blocks=OTHER))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 300), dtype=np.float32)
    w = rng.standard_normal((300, 200), dtype=np.float32)

    def f(x, w):
        return dq.tanh(x @ w)

    depths = []
    real = gemm_runtime.CpuGemm.__call__

    def counting(self, a, b, out, *args, **kwargs):
        depths.append(self.spec.kc)
        return real(self, a, b, out, *args, **kwargs)

    monkeypatch.setattr(gemm_runtime.CpuGemm, "__call__", counting)
    got = dq.jit(f)(x, w)
    assert depths == [128]  # the one product ran through the profile's blocking
    np.testing.assert_allclose(got, dq.jit(f, target="interp")(x, w), rtol=1e-4, atol=1e-4)


def test_calibration_prices_the_blockings_and_keeps_the_fastest(monkeypatch):
    seconds = {128: 3.0, 256: 2.0, 384: 1.0}  # the deepest K slice measured fastest here
    monkeypatch.setattr(
        measure, "fastest_seconds", lambda fn, repeats, cap_s: seconds[fn.__defaults__[0].spec.kc]
    )
    got = measure.gemm_blocks(sizes=((16, 16, 16),))
    assert got == {"kc": 384, "mc": 144}
