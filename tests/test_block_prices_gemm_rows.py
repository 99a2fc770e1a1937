"""Issue 36's last part: our GEMM's products priced under the cache blocks in use from what
calibrate timed for them (calibration/gemm_price.py), and the row kernels' keep-or-recompute
limit a profile value that calibrate measures (calibration/row_crossover.py), that codegen uses
(codegen/kernels/row_limit.py) and the cost model prices (a recomputed row pays its recompute).
Oracles: float64 numpy for the results, the shipped limit's bits, and the plain product price
(plan_cost.product_seconds) for the shipped defaults."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_calibration import cache_dir, sample_profile  # noqa: F401  (a fixture)

import dlvm_eq as dq
from dlvm_eq.calibration import block_prices, gemm_price, measure, plan_cost, row_crossover
from dlvm_eq.codegen.kernels import row_limit
from dlvm_eq.codegen.planning.plan import BlasStep, GemmStep, RowStep
from dlvm_eq.codegen.runtime import batch_gemm, gemm_runtime
from dlvm_eq.extract.machine import machine
from dlvm_eq.extract.profile import Profile, write_profile

SHIPPED = {"kc": gemm_runtime.HOST_WIDE["kc"], "mc": gemm_runtime.HOST_WIDE["mc"]}
OTHER = {"kc": 128, "mc": 96}


@pytest.fixture
def ours(monkeypatch):
    """Our GEMM runs products (DLVM_EQ_GEMM=1), and the shipped blocks and row limit after."""
    monkeypatch.setattr(gemm_runtime, "_ENABLED", True)
    yield
    batch_gemm.use_blocks(None)
    row_limit.use_scratch(None)


def _product_plan():
    a = np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32)
    report = dq.jit(lambda x, y: x @ y).report(a, a)
    (step,) = [
        s.blas if isinstance(s, GemmStep) else s
        for s in report.plan.steps
        if isinstance(s, (BlasStep, GemmStep))
    ]
    return report, step


def _times(other_rel: float):
    return ((SHIPPED["kc"], SHIPPED["mc"], 1.0), (OTHER["kc"], OTHER["mc"], other_rel))


def test_the_gemm_price_follows_the_blocks(cache_dir, ours):
    prices = {}
    for rel in (0.8, 1.25):  # the other blocking measured 20% faster, then 25% slower
        write_profile(sample_profile(gemm_blocks=OTHER, gemm_block_times=_times(rel)))
        report, step = _product_plan()
        mc = machine("cpu")
        base = plan_cost.product_seconds(mc, 256, 256, 256)
        shipped = plan_cost.blas_price(step, report.plan, mc, SHIPPED)[2]
        used = plan_cost.blas_price(step, report.plan, mc)[2]  # the profile's blocks
        assert shipped == pytest.approx(base)
        assert used == pytest.approx(mc.launch + (base - mc.launch) * rel)
        prices[rel] = used
        # the plan's prediction prices the product under the blocks in use
        assert plan_cost.step_price(step, report.plan, mc).seconds >= used
        text = "\n".join(block_prices.block_lines(report.plan))
        assert "product 256 x 256 x 256 NN: kc=128 mc=96" in text
        assert "alternatives: kc=256 mc=288" in text
    assert prices[0.8] < prices[1.25]


def test_the_shipped_defaults_and_old_profiles_price_as_before(cache_dir, ours):
    report, step = _product_plan()
    mc = machine("cpu")
    assert not mc.profile
    for blocks in (None, SHIPPED, OTHER):
        assert plan_cost.blas_price(step, report.plan, mc, blocks)[2] == (
            plan_cost.product_seconds(mc, 256, 256, 256)
        )
    assert not any(line.startswith("product") for line in block_prices.block_lines(report.plan))
    # a profile of before this change: no block timings, no row limit
    data = json.loads(sample_profile(gemm_blocks=OTHER).to_json())
    del data["gemm_block_times"], data["row_scratch"]
    old = Profile.from_json(json.dumps(data))
    assert old.gemm_block_times == () and old.row_scratch == 0
    write_profile(old)
    mc = machine("cpu")
    assert mc.profile and gemm_price.gemm_factor(mc, OTHER) == 1.0
    assert gemm_price.row_scratch_of(mc) == row_limit.SHIPPED_SCRATCH


def test_the_gemm_timings_round_trip_and_are_checked():
    p = sample_profile(gemm_block_times=_times(1.1), row_scratch=16384)
    assert Profile.from_json(p.to_json()) == p
    bad = json.loads(p.to_json())
    bad["gemm_block_times"] = [[256, 288, -1.0]]
    with pytest.raises(Exception, match="positive"):
        Profile.from_json(json.dumps(bad))


def _softmax(x):
    e = dq.exp(x - dq.max(x, axis=-1, keepdims=True))
    return e / dq.sum(e, axis=-1, keepdims=True)


def test_the_row_limit_is_the_profiles_and_changes_no_bit(cache_dir, ours):
    x = np.random.default_rng(1).standard_normal((3, 20000), dtype=np.float32) * 4
    shipped = np.asarray(dq.jit(_softmax)(x))
    report = dq.jit(_softmax).report(x)
    (rows,) = [s for s in report.plan.steps if isinstance(s, RowStep)]
    # rows of 20000 now recompute their exp, measured costly enough to outweigh the bytes
    write_profile(sample_profile(row_scratch=16384, op_flops={"Exp": 400.0, "Log": 30.0}))
    got = np.asarray(dq.jit(_softmax)(x))
    assert row_limit.SCRATCH == 16384
    assert got.tobytes() == shipped.tobytes()
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=2e-3, atol=0)
    mc = machine("cpu")
    assert gemm_price.row_scratch_of(mc) == 16384
    # priced on the same rates with a limit that keeps these rows: one exp per element less
    recomputed = plan_cost.step_price(rows, report.plan, mc).seconds
    write_profile(sample_profile(row_scratch=32768, op_flops={"Exp": 400.0, "Log": 30.0}))
    kept = plan_cost.step_price(rows, report.plan, machine("cpu")).seconds
    assert recomputed > 1.3 * kept


def test_the_crossover_is_the_longest_length_keeping_never_lost():
    c = row_crossover.crossover
    assert c((8, 16, 32), [1, 1, 1], [2, 2, 2]) == 32  # keeping wins everywhere
    assert c((8, 16, 32), [1, 1, 1], [2, 0.5, 2]) == 8  # loses at 16: stop there
    assert c((8, 16, 32), [1, 1, 1], [0.5, 2, 2]) == 4  # loses at the shortest
    assert c((8, 16, 32), [1, 1, 1], [0.98, 0.98, 0.98]) == 32  # within the margin: keep


def test_calibrate_measures_the_row_limit_and_restores_it(cache_dir):
    row_limit.use_scratch(12345)
    try:
        got = row_crossover.row_scratch(lengths=(256, 512), cap_s=0.01)
        assert got in (128, 256, 512)
        assert row_limit.SCRATCH == 12345
    finally:
        row_limit.use_scratch(None)


def test_calibrate_times_each_gemm_blocking(cache_dir):
    chosen, times = measure.gemm_block_choice(candidates=(OTHER,), sizes=((96, 128, 64),))
    assert [(kc, mc) for kc, mc, _ in times] == [(SHIPPED["kc"], SHIPPED["mc"]), (128, 96)]
    assert min(r for *_, r in times) == 1.0 and all(r >= 1.0 for *_, r in times)
    assert chosen in (SHIPPED, OTHER)
