"""How many threads compiled code uses: `DLVM_EQ_NUM_THREADS` when set, else the CPUs this
process may run on: its affinity mask (`taskset`, `os.sched_getaffinity`), capped by the CPU
quota of its cgroup (a container's `--cpus`: cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` /
`cpu.cfs_period_us`, the tightest of the cgroup and its ancestors), rounded up.

    >>> thread_count()                        # read once per process (usable_cpus, below)
    >>> cgroup_cpu_limit("/proc/self/cgroup", "/sys/fs/cgroup")   # e.g. 1.5, or None

Spawning more threads than the quota lets run only gets them descheduled for a whole quota
period (100 ms by default) once the quota is spent; a helper thread descheduled holding work
stalls the caller.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ...config import read, settings


def thread_count(
    environ=None, proc_cgroup: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup"
) -> int:
    """Threads for parallel kernels (the caller's included); at least 1. environ: a mapping
    of settings to parse (dlvm_eq.config.read) instead of the process's settings."""
    n = (settings() if environ is None else read(environ)).num_threads
    if n is not None:  # DLVM_EQ_NUM_THREADS, checked by dlvm_eq.config
        return n
    cpus = affinity_cpus()
    limit = cgroup_cpu_limit(proc_cgroup, cgroup_root)
    if limit is not None:
        cpus = min(cpus, max(1, math.ceil(limit - 1e-9)))
    return cpus


def affinity_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def cgroup_cpu_limit(
    proc_cgroup: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup"
) -> float | None:
    """CPUs' worth of time the process's cgroups allow (quota / period, the smallest along
    the path to the root), or None for no limit or no cgroup information."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits = []
    root = Path(cgroup_root)
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: "0::/path"
            mount = root / "unified" if (root / "unified").is_dir() else root  # hybrid layout
            limits += [_v2(d) for d in _dirs(mount, path)]
        elif "cpu" in controllers.split(","):  # v1: "4:cpu,cpuacct:/path"
            for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                if mount.is_dir():
                    limits += [_v1(d) for d in _dirs(mount, path)]
                    break
    limits = [x for x in limits if x is not None]
    return min(limits) if limits else None


def _dirs(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory and its ancestors up to the mount point. Inside a container the
    path from /proc/self/cgroup may not exist under the mount (a cgroup namespace shows the
    container's own cgroup as the root): the mount's own files are read then."""
    parts = [p for p in path.strip().split("/") if p and p != ".."]
    out = [mount.joinpath(*parts[:i]) for i in range(len(parts), 0, -1)]
    return [d for d in out if d.is_dir()] + [mount]


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def _v2(d: Path) -> float | None:
    text = _read(d / "cpu.max")  # "max 100000" or "150000 100000"
    if not text:
        return None
    fields = text.split()
    if fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1]) if len(fields) > 1 else 100000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1(d: Path) -> float | None:
    quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
    try:
        q, p = int(quota), int(period)
    except (TypeError, ValueError):
        return None
    return q / p if q > 0 and p > 0 else None


_CPUS: int | None = None


def usable_cpus() -> int:
    """Threads for parallel kernels, the caller's included: DLVM_EQ_NUM_THREADS, else the
    CPUs of the affinity mask capped by the cgroup CPU quota (`thread_count`); read once."""
    global _CPUS
    if _CPUS is None:
        _CPUS = thread_count()
    return _CPUS
