"""The fused attention's tiles from the calibrated profile (issue 33): `attention_blocks`,
timed by calibration/attention_tiles.py over candidates, reach the compiled program's steps
(the plan says which) and the cost model's price; without a profile the shipped tiles of
ir/attention_op.py. Results stay the interpreter's whatever the tiles."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_calibration import cache_dir, sample_profile  # noqa: F401  (a fixture)

from dlvm_eq.calibration import attention_tiles as calib
from dlvm_eq.extract.attention_cost import attention_seconds, machine_tiles
from dlvm_eq.extract.machine import machine
from dlvm_eq.extract.profile import Profile, ProfileError, write_profile
from dlvm_eq.extract.target_cost import TargetCost
from dlvm_eq.ir.attention_op import KEY_BLOCK, QUERY_BLOCK, tile_blocks, use_tile_blocks
from dlvm_eq.ir.types import DType, TensorType

OTHER = {"query": 32, "key": 64}


@pytest.fixture
def shipped_tiles_after():
    yield
    use_tile_blocks(None)
    assert tile_blocks() == (QUERY_BLOCK, KEY_BLOCK)


def test_profile_keeps_its_attention_blocks():
    p = sample_profile(attention_blocks=OTHER)
    assert Profile.from_json(p.to_json()) == p
    assert Profile.from_json(sample_profile().to_json()).attention_blocks == {}


@pytest.mark.parametrize("tiles", [{"query": 0, "key": 64}, {"query": 32}, {"q": 32, "key": 64}])
def test_malformed_attention_blocks_are_refused(tiles):
    data = json.loads(sample_profile().to_json())
    data["attention_blocks"] = tiles
    with pytest.raises(ProfileError):
        Profile.from_json(json.dumps(data))


def test_a_profiles_tiles_reach_the_program_and_the_price(cache_dir, shipped_tiles_after):
    t = TensorType((2, 1024, 16), DType.f32)
    shipped = attention_seconds(TargetCost("cpu", {}), t, lambda i: t)
    write_profile(sample_profile(attention_blocks=OTHER))
    assert machine_tiles(machine("cpu")) == (32, 64)
    # 32 x 64 tiles: 16x the pairs, each with its fixed cost; the price follows the tiles
    assert attention_seconds(TargetCost("cpu", {}), t, lambda i: t) != shipped
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 100, 16)).astype(np.float32) for _ in range(3))
    from dlvm_eq.ir import FunctionBuilder, Module
    from dlvm_eq.pipeline.native import compile as native_compile

    ty = TensorType(q.shape, DType.f32)
    b = FunctionBuilder("attn", [ty, ty, ty], ["q", "k", "v"])
    zero = b.const(0.0, DType.f32)
    m = Module("attn")
    m.add(b.finish(b.emit("attention", [*b.params, zero], scale=0.25, causal=1)))
    fused = native_compile(m, "attn", "cpu", optimize=False)
    assert "tiles=32x64" in str(fused.plan)
    causal = np.tril(np.ones((100, 100), bool))
    s = np.where(causal, q.astype(np.float64) @ k.transpose(0, 2, 1) * 0.25, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(fused(q, k, v), want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_without_a_profile_the_shipped_tiles(cache_dir, shipped_tiles_after):
    assert machine_tiles(machine("cpu")) == (QUERY_BLOCK, KEY_BLOCK)


def test_calibration_times_the_candidates_and_keeps_the_fastest(monkeypatch):
    seconds = {(8, 16): 3.0, (16, 8): 1.0, (16, 16): 2.0}
    calls = []

    def fake(fn, repeats, cap_s):
        calls.append(fn.__defaults__[0])
        fn()  # the kernels run with these tiles
        return seconds[fn.__defaults__[0]]

    monkeypatch.setattr(calib, "fastest_seconds", fake)
    got = calib.attention_blocks(candidates=tuple(seconds), shape=(1, 40, 8))
    assert got == {"query": 16, "key": 8} and calls == list(seconds)
