"""How the caches lose a buffer while a program works on other things: what `calibrate` measures
so that `plan_cost` can price a step whose operands were last touched long before it.

    miss, by_bytes, by_seconds = cache_timings()
    # miss: extra seconds per byte a step pays for data the caches no longer hold
    # by_bytes: ((bytes of other data moved since, fraction lost), ...)
    # by_seconds: ((seconds of other work since, fraction lost), ...)

Every other calibration calls the same step again and again, its data hot in the caches.
Inside a program it is not: the small CNN's steps (batch 32, 16x16) summed to 4.3-5.4 ms
called one at a time, 6.2-8.4 ms in the program's order. Two things take the data away:
- the program's own traffic (a map over 1 MiB kept its speed after 8 MiB of other data had
  been moved, and ran at memory speed, 4x slower, after 16-32 MiB: the share of the 32 MiB L3
  that this VM gets);
- time: on this shared host, 1 MiB untouched for 4 ms while the thread only spun (or computed
  products of small matrices) was mostly gone (other tenants share the caches, and the host
  moves virtual CPUs between cores). How fast varies from minute to minute.
Both are measured here with one probe, a compiled map over PROBE_BYTES read and PROBE_BYTES
written: its time right after itself (hot), after a pass over 64 MiB of other data (cold), and
after each amount of other data or of other work; a point's lost fraction is where its time
lies between hot and cold.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

PROBE_ELEMENTS = 1 << 18                 # 1 MiB of f32 read, 1 MiB written
PROBE_BYTES = 4 * PROBE_ELEMENTS
OTHER_MIB = (1, 2, 4, 8, 12, 16, 24, 32)  # other data moved between two probes
COLD_MIB = 64                            # twice the L3: nothing of the probe's data is left
WORK_MS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)   # other work between two probes
REPEATS = 15


def _probe():
    """The probe on the calling thread only: split over the pool, a probe after a spin of
    more than DLVM_EQ_SPIN_US found the workers asleep and timed their wake-up as lost data."""
    from ..codegen import KernelInput, KernelSpec, Load
    from ..codegen.runtime.cpu_kernel import CpuKernel
    k = CpuKernel(KernelSpec("calib_cache_probe", (PROBE_ELEMENTS,), [KernelInput("f32")], [Load(0) + 1.0]), threads=1)
    x, out = np.ones(PROBE_ELEMENTS, np.float32), np.empty(PROBE_ELEMENTS, np.float32)
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
    blocks: list[list[float]] = []        # [sum, count] of each pooled run
    for _, f in curve:
        blocks.append([f, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    fitted = [b[0] / b[1] for b in blocks for _ in range(int(b[1]))]
    return ((0.0, 0.0),) + tuple((float(a), round(f, 4)) for (a, _), f in zip(curve, fitted))


def cache_timings() -> tuple[float, tuple, tuple]:
    """(extra seconds per byte of lost data, lost fraction by bytes moved, by seconds of work)."""
    probe = _probe()
    probe()
    other = np.zeros(COLD_MIB << 18, np.float32)

    def move(mib: int):
        part = other[:mib << 18]
        return lambda: np.add(part, 1.0, out=part)

    def work(ms: float):
        # other work that moves no data of its own (that is `move`'s part): the thread spins.
        # Work on both cores (products) read as 13-25% lost already after 0.1 ms: OpenBLAS's
        # threads spinning on after a product, not the caches
        def run():
            end = time.perf_counter() + ms * 1e-3
            while time.perf_counter() < end:
                pass
        return run
    conditions = [lambda: None, move(COLD_MIB)] + [move(m) for m in OTHER_MIB] + [work(ms) for ms in WORK_MS]
    hot, cold, *rest = _medians(conditions, probe)
    moved, worked = rest[:len(OTHER_MIB)], rest[len(OTHER_MIB):]
    by_bytes = [(mib << 20, _fraction(t, hot, cold)) for mib, t in zip(OTHER_MIB, moved)]
    by_seconds = [(ms * 1e-3, _fraction(t, hot, cold)) for ms, t in zip(WORK_MS, worked)]
    miss = max(0.0, cold - hot) / (2 * PROBE_BYTES)
    return miss, _monotone(by_bytes), _monotone(by_seconds)


__all__ = ["PROBE_BYTES", "cache_timings"]
