"""The fused forward's fixed cost per task, measured (issues 33 and 36): `dlvm-eq calibrate`
fits it over sizes (calibration/attention_tiles.attention_task_seconds), the profile keeps it,
and the cost model prices a calibrated machine's fused tasks with it
(extract/attention_cost.task_seconds); without a profile, the shipped TASK_SECONDS. The fit is
checked on a stand-in kernel whose costs are known, timed by a stand-in timer: no timing here."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_calibration import cache_dir, sample_profile  # noqa: F401  (a fixture)

from dlvm_eq.calibration import attention_tiles as calib
from dlvm_eq.calibration import profile_table
from dlvm_eq.codegen.runtime import attention_cpu
from dlvm_eq.extract import attention_cost
from dlvm_eq.extract.machine import machine
from dlvm_eq.extract.profile import Profile, ProfileError, write_profile
from dlvm_eq.extract.target_cost import TargetCost
from dlvm_eq.ir.types import DType, TensorType

TILES = (8, 16)
CALL, TASK, PAIR = 40e-6, 25e-6, 440e-6  # a pair ~15x a task, as on the EPYC


class StandIn:
    """attention_forward's stand-in: records what it was called with; `seconds()` is what the
    last call would take: CALL + TASK a (batch index, query block) + PAIR a tile pair."""

    def __init__(self):
        self.last = None
        self.calls = []

    def __call__(self, q, k, v, bias, scale, causal, out, threads, blocks):
        self.last = (q.shape, k.shape, blocks)
        self.calls.append((threads, blocks))

    def seconds(self) -> float:
        (batch, m, _), (_, n, _), (tq, tk) = self.last
        tasks = batch * -(-m // tq)
        return CALL + TASK * tasks + PAIR * tasks * -(-n // tk)


def _fit(monkeypatch, sizes=calib.TASK_FIT, disturb=lambda i, t: t):
    kernel = StandIn()
    monkeypatch.setattr(attention_cpu, "attention_forward", kernel)
    timed = []

    def timer(fn):
        fn()
        timed.append(kernel.seconds())
        return disturb(len(timed) - 1, timed[-1])

    return calib.attention_task_seconds(TILES, sizes, rounds=3, timer=timer), kernel, timed


def test_the_fit_recovers_a_kernels_task_cost(monkeypatch):
    got, kernel, timed = _fit(monkeypatch)
    assert got == pytest.approx(TASK, rel=1e-9)
    assert len(timed) == 3 * len(calib.TASK_FIT)  # every size in every sweep
    assert set(kernel.calls) == {(1, TILES)}  # one thread, the tiles asked for


def test_a_disturbed_sweep_does_not_move_the_fit(monkeypatch):
    """A size timed while the machine was busy (3x: one size in each sweep) is timed again in
    the other sweeps; the least of the three is what the fit reads."""
    n = len(calib.TASK_FIT)
    busy = (0, n + 5, 2 * n + 9)
    got, _, _ = _fit(monkeypatch, disturb=lambda i, t: 3 * t if i in busy else t)
    assert got == pytest.approx(TASK, rel=1e-9)


def test_the_sizes_tell_a_task_from_a_pair():
    """At each count of pairs the same pairs are split over several task counts (the slope at
    fixed pairs is a task's cost), and the design has full rank; with times 1% off at random,
    the task comes out within 25% (a per-size error of 1% is 4.4 us of a 440 us pair)."""
    design = np.array([[1.0, t, t * k] for t, k in calib.TASK_FIT])
    assert np.linalg.matrix_rank(design) == 3
    pairs = {}
    for t, k in calib.TASK_FIT:
        pairs.setdefault(t * k, set()).add(t)
    assert all(len(ts) >= 3 for ts in pairs.values()), pairs
    exact = design @ np.array([CALL, TASK, PAIR])
    for seed in range(20):
        noisy = exact * (1 + 0.01 * np.random.default_rng(seed).uniform(-1, 1, len(exact)))
        (_, task, _), *_ = np.linalg.lstsq(design, noisy, rcond=None)
        assert abs(task - TASK) < 0.25 * TASK, (seed, task)


def test_a_profile_keeps_its_task_seconds():
    p = sample_profile(attention_task_seconds=3e-5)
    assert Profile.from_json(p.to_json()) == p
    older = json.loads(sample_profile().to_json())
    del older["attention_task_seconds"]  # a profile of an earlier calibrate
    assert Profile.from_json(json.dumps(older)).attention_task_seconds == 0.0
    bad = json.loads(p.to_json())
    bad["attention_task_seconds"] = -1e-5
    with pytest.raises(ProfileError):
        Profile.from_json(json.dumps(bad))
    assert "30.00 us a fused forward task" in profile_table(p)


def test_a_calibrated_machine_prices_each_task_at_its_measurement(cache_dir):
    """(2, 1024, 16) under the shipped forward tiles (512 x 256): 4 tasks. Two profiles that
    differ in the task's cost alone price the fused forward 4 x their difference apart; a
    profile without it, and the shipped defaults, at TASK_SECONDS."""
    t = TensorType((2, 1024, 16), DType.f32)
    tq, _ = attention_cost.machine_tiles(machine("cpu"), forward=True)
    tasks = 2 * math.ceil(1024 / tq)
    shipped = attention_cost.task_seconds(machine("cpu"))
    assert shipped == attention_cost.TASK_SECONDS
    price = {}
    for task in (0.0, 1e-3):
        write_profile(sample_profile(attention_task_seconds=task))
        assert machine("cpu").profile  # calibrated
        assert attention_cost.task_seconds(machine("cpu")) == (task or shipped)
        price[task] = attention_cost.attention_seconds(TargetCost("cpu", {}), t, lambda i: t)
    assert price[1e-3] - price[0.0] == pytest.approx(tasks * (1e-3 - shipped), rel=1e-9)
