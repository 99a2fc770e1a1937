"""The compile report names the block sizes in use (issue 36): our GEMM's tile and cache blocks,
the convolutions' blocking, each from the calibrated profile or shipped; and it prices every
convolution step under the alternatives calibration times (calibration/block_prices.py), the
price of the blocks in use being the one the plan's prediction uses."""

from __future__ import annotations

import numpy as np
import pytest
from test_calibration import cache_dir, sample_profile  # noqa: F401  (a fixture)

import dlvm_eq as dq
from dlvm_eq.calibration import block_prices, plan_cost
from dlvm_eq.calibration.view_cost import views_seconds
from dlvm_eq.codegen.planning.window import WindowStep
from dlvm_eq.codegen.runtime import batch_gemm, conv_blocks
from dlvm_eq.extract.machine import machine
from dlvm_eq.extract.profile import MatmulPoint, write_profile

BLOCKS = {"chunk_bytes": 1 << 20, "per_image_macs": 1 << 10}


@pytest.fixture
def shipped_blocks_after():
    yield
    batch_gemm.use_blocks(None)
    conv_blocks.use_blocks(None)


def _f(x, w):
    return dq.sum(dq.tanh(dq.conv2d(x, w, padding=1)))


def _report(x, w):
    return dq.jit(dq.grad(_f, argnums=(0, 1))).report(x, w)


def _operands(n=16, c=8, hw=12):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, hw, hw), dtype=np.float32)
    w = rng.standard_normal((8, c, 3, 3), dtype=np.float32)
    return x, w


def test_the_report_names_the_shipped_blocks(cache_dir, shipped_blocks_after):
    text = str(_report(*_operands()))
    assert "(profile)" not in text
    assert "GEMM" in text and "(shipped); convolutions chunks 64 MB, per image <= 262144" in text
    for op in ("conv2d", "conv2dBackwardInput", "conv2dBackwardWeight"):
        assert f"\n  {op} -> " in text


def test_the_report_names_the_profiles_blocks_and_prices_the_alternatives(
    cache_dir, shipped_blocks_after
):
    # products measured slow when small: one product per image prices above one per chunk
    points = (
        MatmulPoint(8, 72, 144, 40e-6),
        MatmulPoint(8, 72, 16 * 144, 60e-6),
        MatmulPoint(72, 8, 144, 40e-6, trans_a=True),
        MatmulPoint(72, 8, 16 * 144, 60e-6, trans_a=True),
        MatmulPoint(72, 144, 8, 40e-6, trans_b=True),
        MatmulPoint(72, 16 * 144, 8, 60e-6, trans_b=True),
        MatmulPoint(8, 144, 72, 40e-6, trans_b=True),
    )
    profile = sample_profile(conv_blocks=BLOCKS, gemm_blocks={"kc": 128, "mc": 96}, matmuls=points)
    write_profile(profile)
    x, w = _operands()
    report = _report(x, w)
    text = str(report)
    assert conv_blocks.BLOCKS == BLOCKS
    assert "kc=128 mc=96 (profile)" in text
    assert "convolutions chunks 1 MB, per image <= 1024 (profile)" in text
    mc = machine("cpu")
    convs = [s for s in report.plan.steps if isinstance(s, WindowStep)]
    assert len(convs) == 3
    for step in convs:
        (used, seconds), *others = block_prices.conv_alternatives(step, report.plan, mc)
        assert used == BLOCKS
        assert seconds == plan_cost.step_price(step, report.plan, mc).seconds - mc.step_call - (
            views_seconds(mc, step)
        )
        assert f"{step.op} -> " in text and block_prices.conv_text(others[0][0]) in text
        # the per-image alternative (16 products of a group each) is priced apart from chunks
        per_image = [s for b, s in others if b["per_image_macs"] >= 8 * 72 * 144]
        assert per_image and all(s > seconds for s in per_image)
