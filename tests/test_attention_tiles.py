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
from dlvm_eq.extract.attention_cost import (
    attention_backward_seconds,
    attention_seconds,
    machine_tiles,
)
from dlvm_eq.extract.machine import machine
from dlvm_eq.extract.profile import Profile, ProfileError, write_profile
from dlvm_eq.extract.target_cost import TargetCost
from dlvm_eq.ir import FunctionBuilder, Module, interpret
from dlvm_eq.ir.attention_op import (
    FORWARD_KEY_BLOCK,
    FORWARD_QUERY_BLOCK,
    KEY_BLOCK,
    QUERY_BLOCK,
    forward_tile_blocks,
    tile_blocks,
    use_tile_blocks,
)
from dlvm_eq.ir.types import DType, TensorType
from dlvm_eq.pipeline.native import compile as native_compile

OTHER = {"query": 32, "key": 64}
FORWARD_OTHER = {"query": 16, "key": 48}


@pytest.fixture
def shipped_tiles_after():
    yield
    use_tile_blocks(None)
    assert tile_blocks() == (QUERY_BLOCK, KEY_BLOCK)
    assert forward_tile_blocks() == (FORWARD_QUERY_BLOCK, FORWARD_KEY_BLOCK)


def test_profile_keeps_its_attention_blocks():
    p = sample_profile(attention_blocks=OTHER, attention_forward_blocks=FORWARD_OTHER)
    assert Profile.from_json(p.to_json()) == p
    assert Profile.from_json(sample_profile().to_json()).attention_blocks == {}
    assert Profile.from_json(sample_profile().to_json()).attention_forward_blocks == {}


@pytest.mark.parametrize("tiles", [{"query": 0, "key": 64}, {"query": 32}, {"q": 32, "key": 64}])
@pytest.mark.parametrize("field", ["attention_blocks", "attention_forward_blocks"])
def test_malformed_attention_blocks_are_refused(tiles, field):
    data = json.loads(sample_profile().to_json())
    data[field] = tiles
    with pytest.raises(ProfileError):
        Profile.from_json(json.dumps(data))


def _forward_and_backward(shape, causal):
    """attn(q, k, v, g) -> (o, dQ, dK, dV): the fused forward and its fused backward."""
    ty = TensorType(shape, DType.f32)
    b = FunctionBuilder("attn", [ty] * 4, ["q", "k", "v", "g"])
    q, k, v, g = b.params
    zero = b.const(0.0, DType.f32)
    o = b.emit("attention", [q, k, v, zero], scale=0.25, causal=causal)
    back = [
        b.emit("attentionBackward", [q, k, v, zero, g if wrt == 2 else o, g], scale=0.25,
               causal=causal, wrt=wrt)
        for wrt in range(3)
    ]  # fmt: skip
    m = Module("attn")
    m.add(b.finish([o, *back]))
    return m


def test_a_profiles_tiles_reach_the_program_and_the_price(cache_dir, shipped_tiles_after):
    """The backward runs `attention_blocks`, the forward `attention_forward_blocks`; each price
    follows its kernel's tiles; results stay the interpreter's (float64) under both."""
    t = TensorType((2, 1024, 16), DType.f32)
    cpu = lambda: TargetCost("cpu", {})
    shipped = attention_seconds(cpu(), t, lambda i: t)
    shipped_back = attention_backward_seconds(cpu(), t, lambda i: t)
    write_profile(sample_profile(attention_blocks=OTHER, attention_forward_blocks=FORWARD_OTHER))
    assert machine_tiles(machine("cpu")) == (32, 64)
    assert machine_tiles(machine("cpu"), forward=True) == (16, 48)
    # smaller tiles: more pairs, each with its fixed cost; each price follows its tiles
    assert attention_seconds(cpu(), t, lambda i: t) > shipped
    assert attention_backward_seconds(cpu(), t, lambda i: t) > shipped_back
    rng = np.random.default_rng(0)
    shape = (2, 100, 16)
    args = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    module = _forward_and_backward(shape, causal=1)
    fused = native_compile(module, "attn", "cpu", optimize=False)
    plan = str(fused.plan)
    assert "attention(" in plan and "attentionBackward(" in plan, plan
    fwd_line = next(line for line in plan.splitlines() if "attention(" in line)
    back_line = next(line for line in plan.splitlines() if "attentionBackward(" in line)
    assert "tiles=16x48" in fwd_line and "tiles=32x64" in back_line, plan
    want = interpret(module, "attn", *[a.astype(np.float64) for a in args], float64=True)
    for got, w in zip(fused(*args), want):
        np.testing.assert_allclose(got, w, rtol=0, atol=1e-5 * np.abs(w).max())


def test_without_a_profile_the_shipped_tiles(cache_dir, shipped_tiles_after):
    assert machine_tiles(machine("cpu")) == (QUERY_BLOCK, KEY_BLOCK)
    assert machine_tiles(machine("cpu"), forward=True) == (FORWARD_QUERY_BLOCK, FORWARD_KEY_BLOCK)


def test_an_older_profile_without_forward_tiles_runs_the_shipped_forward(
    cache_dir, shipped_tiles_after
):
    write_profile(sample_profile(attention_blocks=OTHER))
    assert machine_tiles(machine("cpu"), forward=True) == (FORWARD_QUERY_BLOCK, FORWARD_KEY_BLOCK)
    use_tile_blocks(OTHER, None)
    assert forward_tile_blocks() == (FORWARD_QUERY_BLOCK, FORWARD_KEY_BLOCK)


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


def test_forward_calibration_times_the_forward_alone(monkeypatch):
    seconds = {(8, 16): 3.0, (16, 8): 2.0, (16, 16): 1.0}
    calls = []

    def fake(fn, repeats, cap_s):
        calls.append(fn.__defaults__[0])
        fn()  # the forward runs with these tiles
        return seconds[fn.__defaults__[0]]

    monkeypatch.setattr(calib, "fastest_seconds", fake)
    got = calib.attention_forward_blocks(candidates=tuple(seconds), shape=(1, 40, 8))
    assert got == {"query": 16, "key": 16} and calls == list(seconds)
    assert calib.FORWARD in calib.FORWARD_CANDIDATES  # the shipped forward tiles are a candidate
