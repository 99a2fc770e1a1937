"""How the caches lose a buffer while a program works on other things: what `calibrate` measures
so that `plan_cost` can price a step whose operands were last touched long before it.

    curves = cache_timings()       # one CacheCurve per probe size (extract/profile.py)
    # .probe_bytes: the probe buffers' size; .miss_seconds: extra seconds per byte a step pays
    # for data the caches no longer hold; .by_bytes: ((bytes of other data moved since, fraction
    # lost), ...); .by_seconds: ((seconds of other work since, fraction lost), ...)

Every other calibration calls the same step again and again, its data hot in the caches.
Inside a program it is not: the small CNN's steps (batch 32, 16x16) summed to 4.3-5.4 ms
called one at a time, 6.2-8.4 ms in the program's order. Two things take the data away:
- the program's own traffic (a map over 1 MiB kept its speed after 8 MiB of other data had
  been moved, and ran at memory speed, 4x slower, after 16-32 MiB: the share of the 32 MiB L3
  that this VM gets);
- time: on this shared host, data untouched while the cores do other work goes (other tenants
  share the caches, and the host moves virtual CPUs between cores): a map over 256 KiB (in the
  1 MiB L2) ran 1.4x slower after 200 us of a spin, 5x after 3 ms; one over 1 MiB (already
  mostly in L3) kept its speed for 2 ms and lost half after 4. How fast varies from minute to
  minute.
Both are measured with a compiled map reading and writing PROBE_SIZES bytes each (the two cache
levels), split over the pool as a program's steps are: its time right after itself (hot), after a pass over 64 MiB of
other data (cold), and after each amount of other data or of other work; a point's lost
fraction is where its time lies between hot and cold, the points fitted to a curve that never
falls. The conditions take turns repeat by repeat, so a slow second slows all of them alike.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..extract.profile import CacheCurve

PROBE_SIZES = (256 << 10, 1 << 20)  # bytes read (and written) by each probe: L2, L3
OTHER_MIB = (1, 2, 4, 8, 12, 16, 24, 32)  # other data moved between two probes
COLD_MIB = 64  # twice the L3: nothing of the probe's data is left
WORK_MS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # other work between two probes
REPEATS = 15


def _probe(nbytes: int):
    """The probe as a program's steps run: split over the worker pool."""
    from ..codegen import KernelInput, KernelSpec, Load, compile_cpu

    n = nbytes // 4
    k = compile_cpu(
        KernelSpec(f"calib_cache_probe_{n}", (n,), [KernelInput("f32")], [Load(0) + 1.0])
    )
    x, out = np.ones(n, np.float32), np.empty(n, np.float32)
    return lambda: k(x, out=out)


def _medians(conditions: list, probe, repeats: int = REPEATS) -> list[float]:
    """The median probe time after each condition (a function run first, not timed), the
    conditions taking turns repeat by repeat: a machine that slows for a second or two (this
    one does, by 1.5x) slows every condition alike instead of the few measured then."""
    times: list[list[float]] = [[] for _ in conditions]
    for _ in range(repeats):
        for before, out in zip(conditions, times):
            before()
            t0 = time.perf_counter()
            probe()
            out.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def _fraction(t: float, hot: float, cold: float) -> float:
    return min(1.0, max(0.0, (t - hot) / (cold - hot))) if cold > hot else 0.0


def _monotone(curve) -> tuple[tuple[float, float], ...]:
    """The least-squares non-decreasing fit of the fractions (pool adjacent violators: a noisy
    point is averaged with its neighbours, not carried onto every larger amount as a running
    maximum would), starting at (0, 0): data just touched is in cache."""
    blocks: list[list[float]] = []  # [sum, count] of each pooled run
    for _, f in curve:
        blocks.append([f, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    fitted = [b[0] / b[1] for b in blocks for _ in range(int(b[1]))]
    return ((0.0, 0.0),) + tuple((float(a), round(f, 4)) for (a, _), f in zip(curve, fitted))


def _products(ms: float):
    """Other work as a program does it, moving little data of its own (that is the passes'
    part): products of 128 x 128 matrices on both cores, for `ms`. What the probe finds after
    them is what a step finds after a program's products: its data partly gone, and the cores
    still held by OpenBLAS's threads for a while (a spin, which leaves the cores to the pool,
    read as 0-3% lost where products read 6-30%; the small CNN's steps that follow its
    convolutions ran 1.7x their time with the convolutions skipped)."""
    a = np.ones((128, 128), np.float32)
    c = np.empty_like(a)

    def run():
        end = time.perf_counter() + ms * 1e-3
        while time.perf_counter() < end:
            np.matmul(a, a, out=c)

    return run


def cache_timings(probe_sizes=PROBE_SIZES) -> tuple[CacheCurve, ...]:
    """One CacheCurve per probe size: the miss cost per byte and the lost fraction by bytes
    moved and by seconds of other work."""
    other = np.zeros(COLD_MIB << 18, np.float32)

    def move(mib: int):
        part = other[: mib << 18]
        return lambda: np.add(part, 1.0, out=part)

    conditions = (
        [lambda: None, move(COLD_MIB)]
        + [move(m) for m in OTHER_MIB]
        + [_products(ms) for ms in WORK_MS]
    )
    curves = []
    for nbytes in probe_sizes:
        probe = _probe(nbytes)
        probe()
        hot, cold, *rest = _medians(conditions, probe)
        moved, worked = rest[: len(OTHER_MIB)], rest[len(OTHER_MIB) :]
        curves.append(
            CacheCurve(
                probe_bytes=float(nbytes),
                miss_seconds=max(0.0, cold - hot) / (2 * nbytes),
                by_bytes=_monotone(
                    [(mib << 20, _fraction(t, hot, cold)) for mib, t in zip(OTHER_MIB, moved)]
                ),
                by_seconds=_monotone(
                    [(ms * 1e-3, _fraction(t, hot, cold)) for ms, t in zip(WORK_MS, worked)]
                ),
            )
        )
    return tuple(curves)


__all__ = ["PROBE_SIZES", "cache_timings"]
