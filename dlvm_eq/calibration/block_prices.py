"""The block sizes a compiled CPU program runs with, for its compile report (issue 36): our
GEMM's micro-tile and cache blocks and the convolutions' blocking, each said to come from the
calibrated profile or the shipped constants; and every convolution step of the plan priced by
the cost model (plan_cost.window_price) under each blocking calibration times
(measure.CONV_BLOCKS), the one in use first; and each product our GEMM runs priced under each
(kc, mc) calibrate timed (calibration/gemm_price.py), where the profile holds those timings.

    >>> print("\\n".join(block_lines(plan)))
    blocks: GEMM 12x32 kc=256 mc=288 (shipped); convolutions chunks 64 MB, per image <= 262144 (shipped)
    conv2d -> 128 64 14 14: 1 chunk of 128 images, 6.946 ms; alternatives: chunks 16 MB, per image <= 262144 6.948 ms, ...
"""

from __future__ import annotations

from ..codegen.kernels.spec import DTYPES
from ..codegen.planning.plan import BlasStep, GemmStep, Plan
from ..codegen.planning.window import WindowStep
from ..codegen.runtime import conv_blocks
from ..extract.machine import Machine, machine
from ..ir import window_ops
from ..units import seconds_text
from .gemm_price import profile_of
from .plan_cost import blas_price, window_price


def _source(in_use: dict, shipped: dict) -> str:
    return "shipped" if in_use == shipped else "profile"


def gemm_text() -> str:
    """Our GEMM's wide tile in use and where its cache blocks come from."""
    from ..codegen.runtime import gemm_runtime  # the GEMM runtime loads for a report only

    t = gemm_runtime.WIDE
    return f"GEMM {t['mr']}x{t['nr']} kc={t['kc']} mc={t['mc']} " + (
        f"({_source(t, gemm_runtime.HOST_WIDE)})"
    )


def conv_text(blocks: dict) -> str:
    """A convolution blocking in words: chunk bytes, and the largest group product (in
    multiply-adds) run one per image."""
    return (
        f"chunks {blocks['chunk_bytes'] / (1 << 20):g} MB, per image <= {blocks['per_image_macs']}"
    )


def conv_alternatives(step: WindowStep, plan: Plan, mc: Machine) -> list[tuple[dict, float]]:
    """(blocks, predicted seconds) of a convolution step under the blocks in use, then under
    each other blocking calibration times."""
    from .measure import CONV_BLOCKS  # the candidates calibrate times

    in_use = dict(conv_blocks.BLOCKS)
    candidates = [in_use] + [dict(b) for b in CONV_BLOCKS if dict(b) != in_use]
    return [(b, window_price(step, plan, mc, b)[2]) for b in candidates]


def gemm_alternatives(step: BlasStep, plan: Plan, mc: Machine) -> list[tuple[dict, float]]:
    """(blocks, predicted seconds) of a product under our GEMM's blocks in use, then under each
    other blocking the profile timed (gemm_price.py; none without timings)."""
    from ..codegen.runtime import gemm_runtime  # the GEMM runtime loads for a report only

    p = profile_of(mc)
    in_use = {"kc": gemm_runtime.WIDE["kc"], "mc": gemm_runtime.WIDE["mc"]}
    times = p.gemm_block_times if p is not None else ()
    others = [{"kc": kc, "mc": m} for kc, m, _ in times if {"kc": kc, "mc": m} != in_use]
    return [(b, blas_price(step, plan, mc, b)[2]) for b in [in_use] + others]


def _gemm_lines(plan: Plan, mc: Machine) -> list[str]:
    """A line per product our GEMM runs whose price moves with its blocks: priced under the
    blocks in use and each other blocking the profile timed (a product numpy's BLAS runs, or
    one without timings, prices alike under every blocking and gets no line)."""
    lines = []
    for step in plan.steps:
        blas = step.blas if isinstance(step, GemmStep) else step
        if not isinstance(blas, BlasStep):
            continue
        (blocks, seconds), *others = gemm_alternatives(blas, plan, mc)
        if any(t != seconds for _, t in others):
            lines.append(
                f"product {blas_price(blas, plan, mc)[1]}: {gemm_blocks_text(blocks)} "
                f"{seconds_text(seconds)}; alternatives: "
                + "; ".join(f"{gemm_blocks_text(b)}: {seconds_text(t)}" for b, t in others)
            )
    return lines


def gemm_blocks_text(blocks: dict) -> str:
    """Our GEMM's cache blocks in words."""
    return f"kc={blocks['kc']} mc={blocks['mc']}"


def block_lines(plan: Plan, target: str | Machine = "cpu") -> list[str]:
    """The report's lines on blocks: what is in use, and each convolution priced under the
    alternatives (none on the GPU, whose kernels are not blocked this way)."""
    mc = machine(target)
    if mc.name != "cpu":
        return []
    in_use = conv_blocks.BLOCKS
    lines = [
        f"blocks: {gemm_text()}; convolutions {conv_text(in_use)} "
        f"({_source(in_use, conv_blocks.SHIPPED)})"
    ] + _gemm_lines(plan, mc)
    for step in plan.steps:
        if not isinstance(step, WindowStep) or step.op not in window_ops.CONV_OPS:
            continue
        (blocks, seconds), *others = conv_alternatives(step, plan, mc)
        out = plan.slots[step.out]
        dims = conv_blocks.conv_dims(step.op, [v.shape for v in step.inputs], out.shape)
        groups = window_ops.unpack(step.op, step.packed)["groups"]
        itemsize = DTYPES[out.dtype].itemsize
        work = conv_blocks.conv_work(step.op, *dims, groups, itemsize, blocks)
        lines.append(
            f"{step.op} -> {' '.join(map(str, out.shape))}: {work.strategy}, {seconds_text(seconds)}; "
            + "alternatives: "
            + "; ".join(f"{conv_text(b)}: {seconds_text(s)}" for b, s in others)
        )
    return lines


__all__ = [
    "block_lines",
    "conv_alternatives",
    "conv_text",
    "gemm_alternatives",
    "gemm_blocks_text",
    "gemm_text",
]
