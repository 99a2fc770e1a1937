"""The machine profile (`dlvm-eq calibrate`) and the cost model that reads it."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from dlvm_eq.extract.machine import MACHINES, from_profile, machine
from dlvm_eq.extract.profile import (
    MatmulPoint,
    Profile,
    ProfileError,
    forget_profiles,
    host_id,
    load_profile,
    profile_path,
    write_profile,
)
from dlvm_eq.extract.target_cost import TargetCost


def sample_profile(**changes) -> Profile:
    p = Profile(
        target="cpu",
        host=host_id(),
        bandwidth=20e9,
        flop_rate=50e9,
        launch=4e-6,
        pool_wake=3e-5,
        reduce_rate=4e9,
        op_flops={"Exp": 14.0, "Log": 30.0},
        matmuls=(
            MatmulPoint(16, 16, 16, 2.5e-6),
            MatmulPoint(256, 256, 256, 4e-4),
            MatmulPoint(1024, 1024, 1024, 2e-2),
            MatmulPoint(256, 256, 256, 5e-4, True),
        ),
        measured_at="2026-12-01T00:00:00+00:00",
        seconds=12.0,
    )
    return dataclasses.replace(p, **changes)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    from dlvm_eq import config

    monkeypatch.setenv("DLVM_EQ_CACHE_DIR", str(tmp_path))
    config.reload()  # settings are read once: re-read them for this cache directory
    forget_profiles()
    yield tmp_path
    monkeypatch.undo()
    config.reload()
    forget_profiles()


def test_profile_round_trips_through_json():
    p = sample_profile()
    assert Profile.from_json(p.to_json()) == p


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"version": 99}',
        sample_profile().to_json().replace('"bandwidth": 20000000000.0', '"bandwidth": -1'),
        sample_profile().to_json().replace('"launch"', '"lunch"'),
    ],
)
def test_malformed_profiles_are_refused(text):
    with pytest.raises(ProfileError):
        Profile.from_json(text)


def test_written_profile_is_what_the_cost_model_reads(cache_dir):
    assert machine("cpu") is MACHINES["cpu"]  # no profile: the shipped defaults
    path = write_profile(sample_profile())
    assert path == profile_path("cpu") and path.parent == cache_dir / "profiles"
    with pytest.warns(UserWarning, match="is stale"):  # the sample holds no plan-step grids
        m = machine("cpu")
    assert m.bandwidth == 20e9 and m.launch == 4e-6 and m.op_flops["Exp"] == 14.0
    assert m.profile == sample_profile().digest()


def test_corrupt_profile_falls_back_to_defaults_with_a_warning(cache_dir):
    profile_path("cpu").parent.mkdir(parents=True)
    profile_path("cpu").write_text('{"version": 1, "target": "cpu", "bandwidth": "fast"}')
    with pytest.warns(UserWarning, match="ignoring the machine profile"):
        assert load_profile("cpu") is None
    assert machine("cpu") is MACHINES["cpu"]


def test_profile_of_another_host_is_not_trusted(cache_dir):
    write_profile(sample_profile(host="some other machine x64"))
    with pytest.warns(UserWarning, match="measured on 'some other machine x64'"):
        assert machine("cpu") is MACHINES["cpu"]


def test_matmul_times_interpolate_between_measured_products():
    m = from_profile(sample_profile(), MACHINES["cpu"])
    # the fastest layout of each measured size, exactly
    assert m.matmul_seconds(256, 256, 256) == pytest.approx(4e-4)
    # between two sizes: between their times; below the grid: the smallest call's time
    t = m.matmul_seconds(512, 512, 512)
    assert 4e-4 < t < 2e-2
    assert m.matmul_seconds(2, 2, 2) == pytest.approx(2.5e-6)
    # beyond the grid: the largest product's rate
    assert m.matmul_seconds(2048, 1024, 1024) == pytest.approx(4e-2)


def test_grid_never_prices_a_bigger_product_below_a_smaller_one():
    noisy = sample_profile(
        matmuls=(MatmulPoint(64, 64, 64, 1e-3), MatmulPoint(128, 128, 128, 1e-4))
    )
    m = from_profile(noisy, MACHINES["cpu"])
    assert m.matmul_seconds(128, 128, 128) >= m.matmul_seconds(64, 64, 64)


@pytest.mark.parametrize("calibrated", [False, True])
def test_twentyfold_flop_cut_on_large_products_is_predicted_cheaper(calibrated):
    mc = from_profile(sample_profile(), MACHINES["cpu"]) if calibrated else MACHINES["cpu"]
    cost = TargetCost(mc, {})
    # ((A B) C) against (A (B C)) for A 1000x1000, B 1000x50, C 50x1000 ... and its 20x cheaper order
    bad = cost.dot_seconds(1000, 50, 1000) + cost.dot_seconds(1000, 1000, 1000)
    good = cost.dot_seconds(50, 1000, 1000) + cost.dot_seconds(1000, 50, 1000) / 20
    assert good < bad / 5


def test_measured_op_costs_reach_the_elementwise_price():
    from dlvm_eq.ir.types import F32, tensor

    mc = from_profile(sample_profile(op_flops={"Exp": 100.0}), MACHINES["cpu"])
    t = tensor(1000, 1000, F32)
    assert (
        TargetCost(mc, {}).elementwise_seconds("Exp", t)
        > TargetCost(mc, {}).elementwise_seconds("Add", t) * 5
    )


def test_calibrate_measures_this_host(cache_dir, monkeypatch):
    from dlvm_eq import calibration
    from dlvm_eq.calibration import calibrate, measure, profile_table

    # a small grid keeps the test short; the measurement code is the one `calibrate` runs
    monkeypatch.setattr(measure, "MATMUL_SHAPES", [(32, 32, 32), (128, 128, 128)])
    monkeypatch.setattr(measure, "STREAM_ELEMENTS", 1 << 20)
    original = measure.matmuls
    monkeypatch.setattr(measure, "matmuls", lambda **kw: original(measure.MATMUL_SHAPES, **kw))
    fits = []  # the task-cost fit (tests/test_attention_task_fit.py): on the forward's tiles
    monkeypatch.setattr(calibration, "attention_task_seconds", lambda t: fits.append(t) or 2.5e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = calibrate("cpu")
    fwd = p.attention_forward_blocks
    assert fits == [(fwd["query"], fwd["key"])] and p.attention_task_seconds == 2.5e-5
    assert p.host == host_id() and len(p.matmuls) == 2 * len(measure.LAYOUTS)
    assert all(v > 0 for v in (p.bandwidth, p.flop_rate, p.launch, p.reduce_rate))
    assert set(p.op_flops) >= {"Exp", "Log", "Tanh", "Divide"}
    assert load_profile("cpu") == p and machine("cpu").profile == p.digest()
    assert "GFLOP/s" in profile_table(p)


@pytest.mark.skipif(
    __import__("dlvm_eq.codegen.gpu.gpu_runtime", fromlist=["x"]).gpu_available(),
    reason="a CUDA device is here: calibrating it is no error",
)
def test_calibrating_the_gpu_without_one_says_why(cache_dir):
    from dlvm_eq.calibration import calibrate
    from dlvm_eq.errors import DlvmError

    with pytest.raises(DlvmError, match="CuPy|CUDA"):
        calibrate("gpu")
    assert not (cache_dir / "profiles" / "gpu.json").exists()


def test_calibrating_an_unknown_target_is_an_error():
    from dlvm_eq.calibration import calibrate
    from dlvm_eq.errors import DlvmError

    with pytest.raises(DlvmError, match="unknown calibration target 'tpu'"):
        calibrate("tpu", write=False)


def test_calibrate_measures_the_gpu_as_gpu_programs_run(cache_dir, monkeypatch):
    # the emulated device (fake_cupy) runs every launch thread by thread on the host: tiny sizes;
    # the timings mean nothing there, the code paths and the profile are what is checked
    import fake_cupy

    from dlvm_eq.calibration import calibrate, measure_gpu, measure_steps, profile_table

    monkeypatch.setattr(measure_gpu, "STREAM_ELEMENTS", 1 << 12)
    monkeypatch.setattr(measure_gpu, "CACHED_ELEMENTS", 1 << 10)
    monkeypatch.setattr(measure_gpu, "MATMUL_SHAPES", [(8, 8, 8), (16, 16, 16)])
    monkeypatch.setattr(measure_gpu, "REPEATS", 3)
    monkeypatch.setattr(measure_steps, "GPU_SIZES", (1 << 8, 1 << 10))
    monkeypatch.setattr(measure_steps, "WINDOW_SIZES", ((2, 2, 4, 2),))
    with fake_cupy.installed(monkeypatch, sms=1):
        p = calibrate("gpu")
        assert p.target == "gpu" and p.host == host_id("gpu") and "fake GPU sm_90" in p.host
        assert all(v > 0 for v in (p.bandwidth, p.flop_rate, p.launch, p.reduce_rate))
        assert len(p.matmuls) == 2 * 3 and set(p.op_flops) >= {"Exp", "Log", "Tanh", "Divide"}
        assert {"map", "reduce", "rows", "conv2d", "view_transpose"} <= set(
            p.steps
        ) and not p.outdated
        assert load_profile("gpu") == p and machine("gpu").profile == p.digest()
        assert "GFLOP/s" in profile_table(p)
    # another GPU does not trust it
    from dlvm_eq.extract import profile as profile_mod

    monkeypatch.setattr(profile_mod, "_gpu_id", lambda: "another GPU sm_80")
    forget_profiles()
    with pytest.warns(UserWarning, match="ignoring the machine profile"):
        assert load_profile("gpu") is None
