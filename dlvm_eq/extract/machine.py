"""Machine descriptions: what the target cost model knows about a target.

The CPU figures were measured on a 2-core EPYC with AVX-512 (~40 GB/s copy bandwidth); its
shipped sgemm rate is a flat 300 GFLOP/s. `measured_cpu` prices products per BLAS thread
(`BLAS_RATE_PER_THREAD` times `blas_threads`), with a product's arrays beyond a core's cache
moving at `BLAS_STREAM`. The GPU
figures are an H100/H200-class device (HBM3, ~4 TB/s, ~60 TFLOP/s fp32). Only ratios matter
to extraction; absolute values make the reported costs read as estimated seconds.

`dlvm-eq calibrate` measures this host instead (`profile.py`); `machine(target)` returns the
measured description when this host has a profile, and the shipped defaults otherwise. A
measured machine also knows the per-element cost of each op class (`op_flops`) and matmul times
over a grid of shapes (`matmul_seconds` interpolates them): a product that takes milliseconds
is priced by what such products take here, not by a peak rate.

    >>> measured_cpu({"OPENBLAS_NUM_THREADS": "2"}).blas_rate == 2 * BLAS_RATE_PER_THREAD
    True
    >>> MACHINES["cpu"].cost_key != MACHINES["gpu"].cost_key
    True
"""

from __future__ import annotations

import bisect
import math
import os
from dataclasses import field

from ..config import process_environment
from ..errors import DlvmError
from ..records import dataclass
from .profile import MatmulPoint, Profile, load_profile


@dataclass(frozen=True)
class Machine:
    """The cost model's machine: the rates and overheads extraction prices a program with."""

    name: str
    bandwidth: float  # bytes/s to and from main memory, read + write
    flop_rate: float  # elementwise flop/s over all cores (vector units)
    blas_rate: float  # matmul flop/s (BLAS / cuBLAS)
    launch: float  # seconds per kernel launch or BLAS call
    fused_fraction: float = 0.25  # share of its output traffic and launch a fusable op pays
    node_overhead: float = 1e-10  # seconds per non-view e-node, so that fewer ops win ties
    reduce_rate: float = 0.0  # reduced elements/s; 0: the flop rate
    pool_wake: float = 0.0  # extra seconds of a launch that wakes the worker pool
    op_flops: dict = field(default_factory=dict, hash=False)  # constructor -> flops/element
    matmul_grid: tuple = ()  # ((flops, seconds), ...) sorted by flops, measured
    profile: str = ""  # digest of the profile it came from; "" for the defaults
    # measured products, every layout (MatmulPoint), for pricing a planned product by shape
    matmul_points: tuple = field(default=(), hash=False)
    # plan step kind -> ((bytes moved, seconds), ...), as the executor ran one such step
    step_grids: dict = field(default_factory=dict, hash=False)
    program_call: float = 5e-6  # seconds of one call of a compiled program, steps aside
    step_call: float = 3e-7  # the executor's seconds per step beyond the step's work
    # the caches losing a buffer while the program works elsewhere: one profile.CacheCurve
    # per probe size; () for the defaults: nothing is lost
    cache: tuple = field(default=(), hash=False)
    # bytes/s at which a batched product's operand or result beyond a core's cache moves,
    # beyond its flops (target_cost.streamed_seconds); 0: not priced
    blas_stream: float = 0.0

    @property
    def cost_key(self) -> str:
        """What the prices depend on beyond the code, for cache keys: the profile's digest, or
        for the shipped defaults their target and BLAS rate (which follows the BLAS threads:
        a program optimized with one thread is not read back with two)."""
        return self.profile or f"defaults {self.name} blas {self.blas_rate:g}"

    def matmul_seconds(self, m: int, k: int, n: int) -> float:
        """Seconds of one (m, k) @ (k, n): interpolated between the measured products of
        nearest size (log-log), or a call plus flops at the BLAS rate without measurements."""
        flops = 2.0 * m * k * n
        if not self.matmul_grid:
            return self.launch + flops / self.blas_rate
        return interpolate(self.matmul_grid, flops)


def interpolate(grid, x: float) -> float:
    """y at x on a measured grid ((x, y), ...) sorted by x: log-log between the two nearest
    points; below the grid the smallest point's y (fixed costs dominate there), beyond it the
    largest point's y scaled by x (its rate)."""
    sizes = [g for g, _ in grid]
    i = bisect.bisect_left(sizes, x)
    if i == 0:
        return grid[0][1]
    if i == len(grid):
        f, t = grid[-1]
        return t * x / f
    (f0, t0), (f1, t1) = grid[i - 1], grid[i]
    w = (math.log(x) - math.log(f0)) / (math.log(f1) - math.log(f0))
    return math.exp((1 - w) * math.log(t0) + w * math.log(t1))


# sgemm flop/s of one OpenBLAS thread, CPU time. Measured on the 2-core AMD EPYC (OpenBLAS
# 0.3.31, SkylakeX kernel, float32; s17-s18): one thread 97-104 GFLOP/s on 512^3, 256x784x256,
# 1024x64x1024 and the fused attention's 512x64x256 blocks, two threads 170-200 (1.9-2.0x;
# BENCHMARKS.md, s18-attnprice). The flat 300 GFLOP/s before it was 3x one thread.
BLAS_RATE_PER_THREAD = 100e9
# What a batched product's arrays beyond a core's cache cost beyond its flops. Measured (s18,
# this branch: numpy.matmul, one thread, CPU time, min of 5, load 13, float32): against
# (4, 512, 64) @ (4, 64, 512) at 94.6 GFLOP/s in the same run, (4, 4096, 64) @ (4, 64, 4096)
# took 24.9 ms more for its 268 MB result, (4, 4096, 4096) @ (4, 4096, 64) 16.7 ms more for its
# 268 MB operand, the seq 1024 pair 1.5 and 0.5 ms more for 16.8 MB: 570 MB in 43.6 ms, 13
# GB/s, a third of the copy bandwidth (C is written a tile at a time; the packed panels of a
# big operand come from memory). Without it the plain attention's six products over seq x seq
# scores were priced at their flops and, at 100 GFLOP/s a thread, seq 4096's plain forward +
# backward priced 0.68 of its measured time, below the fused kernels (measured 0.88x plain).
BLAS_STREAM = 13e9


def blas_threads(environ=None) -> int:
    """The threads OpenBLAS splits a product over: OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS
    (OpenBLAS reads them in that order), else the CPUs this process may run on. A value that
    is not a positive whole number counts as unset, as OpenBLAS treats it.

    >>> blas_threads({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "4"})
    1
    """
    env = process_environment() if environ is None else environ
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        text = env.get(name, "").strip()
        if text.isdigit() and int(text) > 0:
            return int(text)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def measured_cpu(environ=None) -> Machine:
    """The shipped CPU machine with the measured BLAS rate: BLAS_RATE_PER_THREAD times the
    BLAS threads, and products' arrays beyond the cache at BLAS_STREAM. It ranks every
    recorded attention pair as measured (tests/test_plain_pricing.py). It is not the default
    yet: on benchmarks/egraph_value.py, under load 6-18, its median prediction error came out
    worse than the flat rate's in 3 of 4 paired runs (BENCHMARKS.md, s18-plainprice), so
    whether it ships waits for a quiet rerun."""
    return Machine(
        "cpu",
        bandwidth=40e9,
        flop_rate=100e9,
        blas_rate=BLAS_RATE_PER_THREAD * blas_threads(environ),
        launch=2e-6,
        blas_stream=BLAS_STREAM,
    )


MACHINES: dict[str, Machine] = {
    # a flat BLAS rate, 3x one thread's: see measured_cpu
    "cpu": Machine("cpu", bandwidth=40e9, flop_rate=100e9, blas_rate=300e9, launch=2e-6),
    "gpu": Machine("gpu", bandwidth=4.0e12, flop_rate=60e12, blas_rate=50e12, launch=5e-6),
}


def from_profile(profile: Profile, default: Machine) -> Machine:
    """The machine a profile measured; what it did not measure comes from `default`."""
    grid = _matmul_grid(profile.matmuls)
    blas_rate = max((f / t for f, t in grid), default=default.blas_rate)
    return Machine(
        profile.target,
        bandwidth=profile.bandwidth,
        flop_rate=profile.flop_rate,
        blas_rate=blas_rate,
        launch=profile.launch,
        fused_fraction=default.fused_fraction,
        node_overhead=default.node_overhead,
        reduce_rate=profile.reduce_rate,
        pool_wake=profile.pool_wake,
        op_flops=dict(profile.op_flops),
        matmul_grid=grid,
        profile=profile.digest(),
        matmul_points=_consistent_products(profile.matmuls),
        step_grids={k: _non_decreasing(g) for k, g in profile.steps.items()},
        program_call=profile.program_call or default.program_call,
        step_call=profile.step_call or default.step_call,
        cache=profile.cache,
    )


def _matmul_grid(points: tuple[MatmulPoint, ...]) -> tuple[tuple[float, float], ...]:
    """One (flops, seconds) per product size, the fastest layout (extraction folds transposes
    into operand flags, so the best layout is the one a program gets), times non-decreasing
    in size so that interpolation never prices a bigger product below a smaller one."""
    best: dict[float, float] = {}
    for p in points:
        best[p.flops] = min(best.get(p.flops, math.inf), p.seconds)
    grid, slowest = [], 0.0
    for f in sorted(best):
        slowest = max(slowest, best[f])
        grid.append((f, slowest))
    return tuple(grid)


def _non_decreasing(grid) -> tuple[tuple[float, float], ...]:
    """A step grid sorted by size, each time at most that of every larger size: a point
    measured while the machine was busy elsewhere does not price its neighbours."""
    out, cap = [], math.inf
    for size, t in sorted(grid, reverse=True):
        cap = min(cap, t)
        out.append((size, cap))
    return tuple(reversed(out))


def _consistent_products(points: tuple[MatmulPoint, ...]) -> tuple[MatmulPoint, ...]:
    """The measured products, each at most as slow as any product of the same layout at least
    as large in m, k and n, and at most twice the fastest layout of its own shape (a product
    timed while the machine was busy would otherwise price every product near it). Products
    with a dimension of 1 are compared among themselves only: an outer product (k = 1) runs as
    a broadcasting multiply, not through BLAS."""
    fastest: dict[tuple, float] = {}
    for p in points:
        fastest[(p.m, p.k, p.n)] = min(fastest.get((p.m, p.k, p.n), math.inf), p.seconds)
    out = []
    for p in points:
        t = min(p.seconds, 2 * fastest[(p.m, p.k, p.n)])
        for q in points:
            if (
                (q.trans_a, q.trans_b) == (p.trans_a, p.trans_b)
                and q.m >= p.m
                and q.k >= p.k
                and q.n >= p.n
                and (1 in (q.m, q.k, q.n)) == (1 in (p.m, p.k, p.n))
            ):
                t = min(t, q.seconds)
        out.append(MatmulPoint(p.m, p.k, p.n, t, p.trans_a, p.trans_b))
    return tuple(out)


def machine(target: str | Machine) -> Machine:
    """The machine description of a target name (`cpu`, `gpu`): this host's measured profile
    when there is one, else the shipped defaults; or the Machine itself."""
    if isinstance(target, Machine):
        return target
    try:
        default = MACHINES[target]
    except KeyError:
        raise DlvmError(
            f"unknown target {target!r}; expected one of {', '.join(MACHINES)}"
        ) from None
    profile = load_profile(target)
    return default if profile is None else _calibrated(profile, default)


_CALIBRATED: dict[str, Machine] = {}


def _calibrated(profile: Profile, default: Machine) -> Machine:
    key = profile.digest()
    m = _CALIBRATED.get(key)
    if m is None:
        m = _CALIBRATED[key] = from_profile(profile, default)
    return m
