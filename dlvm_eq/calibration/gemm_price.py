"""What a profile says of blocks for the cost model (calibration/plan_cost.py). Our GEMM's products priced under the cache blocks they run with (issue 36): calibrate times
the GEMM under each candidate (kc, mc) (measure.gemm_block_table) and the profile keeps each
one's time relative to the fastest (`gemm_block_times`, the shipped blocking first). A product
our GEMM runs is priced as the measured products price it (plan_cost.product_seconds), times
how much slower or faster the blocks in use measured than the shipped ones; without those
timings (the shipped defaults, an older profile) every blocking prices alike, as before. And the row length up to which a row kernel keeps its
costly values (row_scratch_of): a longer row is priced with its recompute.

    >>> round(block_factor(((256, 288, 1.05), (384, 144, 1.0)), {"kc": 384, "mc": 144}), 3)
    0.952
"""

from __future__ import annotations

from ..codegen.kernels.row_limit import MAX_SCRATCH, SHIPPED_SCRATCH
from ..extract.machine import Machine
from ..extract.profile import Profile, load_profile

BlockTimes = tuple[tuple[int, int, float], ...]


def block_factor(times: BlockTimes, blocks: dict | None) -> float:
    """The time of our GEMM under `blocks` over its time under the shipped blocks (the first
    entry of `times`); 1.0 where either was not measured."""
    if not times or not blocks:
        return 1.0
    rel = {(kc, mc): r for kc, mc, r in times}
    got = rel.get((int(blocks["kc"]), int(blocks["mc"])))
    return 1.0 if got is None else got / times[0][2]


_PROFILES: dict[str, Profile] = {}  # digest -> the profile that machine came from


def profile_of(mc: Machine) -> Profile | None:
    """The profile a machine description came from (its digest), or None (the defaults)."""
    if not mc.profile:
        return None
    got = _PROFILES.get(mc.profile)
    if got is None:  # (only a profile found is kept: one written later is found then)
        p = load_profile(mc.name)
        if p is None or p.digest() != mc.profile:
            return None
        got = _PROFILES[mc.profile] = p
    return got


def gemm_factor(mc: Machine, blocks: dict | None = None) -> float:
    """How our GEMM's products scale on `mc` under `blocks` (None: the profile's, which
    pipeline/native.py puts in use) against the shipped blocks."""
    p = profile_of(mc)
    if p is None or not p.gemm_block_times:
        return 1.0
    return block_factor(p.gemm_block_times, blocks or p.gemm_blocks)


def row_scratch_of(mc: Machine) -> int:
    """The row length up to which row kernels keep their values on `mc`: its profile's measured
    crossover (calibration/row_crossover.py), which pipeline/native.py puts in use, else the
    shipped limit (codegen/kernels/row_limit.py)."""
    p = profile_of(mc)
    return min(p.row_scratch, MAX_SCRATCH) if p is not None and p.row_scratch else SHIPPED_SCRATCH


def runs_our_gemm(batch: int, m: int, k: int, n: int) -> bool:
    """Whether the executor runs a 2-D product through our GEMM (gemm_runtime.worth_our_gemm:
    enabled and large enough); batched products go through batch_gemm's own split."""
    from ..codegen.runtime.gemm_runtime import worth_our_gemm  # priced only with block timings

    return batch == 1 and worth_our_gemm(m, k, n)


__all__ = ["block_factor", "gemm_factor", "profile_of", "row_scratch_of", "runs_our_gemm"]
