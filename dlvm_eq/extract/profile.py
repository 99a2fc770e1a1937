"""A measured machine profile: what `dlvm-eq calibrate` timed on this host, as JSON data.

Tensat prices e-nodes with measured operator times; this is the same idea for our cost model
(`machine.py`, `target_cost.py`, `fusion_cost.py`): the profile holds the host's measured
memory bandwidth, elementwise flop rate, per-element cost of each op class (exp, log, tanh,
division...) in flop equivalents, reduction rate, kernel launch and pool wake-up overheads,
matmul times over a grid of shapes, and (version 2) the time of each kind of plan step over a
range of sizes as the executor runs it (`steps`, read by `calibration/plan_cost.py` to predict a
planned program's time), with the cost of a program call and of one step, and (version 3) of
each view op a step reads its operands through, and (version 4) how the caches lose a buffer
while a program does other work (`cache`: read by plan_cost to price the steps that find
their data gone), and (version 5) outer products timed as the executor now runs them (a
broadcasting multiply). Without a profile the shipped defaults (`machine.MACHINES`) are used; a
version-1 profile still prices e-nodes, and plan steps are then priced from its rates; a version-2 one prices views at nothing (a warning asks for a new
calibration either way).

    profile = Profile.from_json(text)           # raises ProfileError on anything malformed
    write_profile(profile)                      # <cache dir>/profiles/<target>.json
    current = load_profile("cpu")               # None without one; a warning if it is corrupt

A profile is data only (numbers and names), read with `json`: nothing on disk runs code. It is
tied to the host it was measured on (`host_id`): a profile from another machine (a cache
directory shared by CI) is ignored with a warning rather than trusted.

Shared state: `_LOADED` memoizes one profile per target and process; a race between two
threads reads the same file twice and keeps either result (they are equal).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import warnings
from dataclasses import asdict, field
from pathlib import Path

from ..cache import default_cache_dir
from ..errors import DlvmError
from ..records import dataclass

PROFILE_VERSION = 5
# a version-1 profile lacks the step timings; a version-2 one the view-op timings, and its flop
# rate counted the kernel call as arithmetic (about half the rate); a version-3 one lacks how
# the caches lose data (every step priced with its data in cache); a version-4 one timed outer
# products through numpy's matmul loop, 4-6x slower than what runs: all still price, with a warning
READABLE_VERSIONS = (1, 2, 3, 4, 5)


# what a profile of an older version lacks (the warning names it)
_MISSING = {
    1: "without plan step timings",
    2: "without view-op timings, its flop rate counting the kernel call",
    3: "without the cache timings: every step priced with its data in cache",
    4: "with its outer products timed through numpy's matmul loop, 4-6x slower than what runs",
}


class ProfileError(DlvmError):
    """A profile file that is not a profile of this version."""


@dataclass(frozen=True)
class MatmulPoint:
    """One measured product: (m, k) @ (k, n) in `seconds`, operands transposed as flagged."""

    m: int
    k: int
    n: int
    seconds: float
    trans_a: bool = False
    trans_b: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n


@dataclass(frozen=True)
class CacheCurve:
    """How the caches lose a buffer of about `probe_bytes` (calibration/program_state.py): the
    extra seconds per byte fetched once lost, and the fraction lost after so many bytes of
    other data moved ((bytes, fraction), ...) or so many seconds of other work ((seconds,
    fraction), ...)."""

    probe_bytes: float
    miss_seconds: float
    by_bytes: tuple[tuple[float, float], ...]
    by_seconds: tuple[tuple[float, float], ...]

    @classmethod
    def from_data(cls, d: dict) -> CacheCurve:
        return cls(
            _positive(d["probe_bytes"]),
            _non_negative(d["miss_seconds"]),
            _fractions(d["by_bytes"]),
            _fractions(d["by_seconds"]),
        )


@dataclass(frozen=True)
class Profile:
    """A target's measured costs (bandwidth, flop rates, launches, products, plan steps) on one host."""

    target: str
    host: str  # host_id() where it was measured
    bandwidth: float  # bytes/s, read + write, streaming
    flop_rate: float  # elementwise flop/s, all cores, in cache
    launch: float  # seconds per kernel call (argument checks + call)
    pool_wake: float  # extra seconds when a call wakes the worker pool
    reduce_rate: float  # reduced elements/s (a sum over a large array)
    op_flops: dict[str, float] = field(default_factory=dict)  # constructor -> flops/element
    matmuls: tuple[MatmulPoint, ...] = ()
    measured_at: str = ""
    seconds: float = 0.0  # how long the calibration took
    # plan step kind -> ((size in bytes moved, seconds), ...) measured through the executor,
    # sizes increasing; the kinds are calibration/plan_cost.py's (map, reduce, rows, copy, ...)
    steps: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    program_call: float = 0.0  # seconds of calling a compiled program, its steps aside
    step_call: float = 0.0  # seconds the executor spends per step beyond its work
    # how a buffer leaves the caches while a program works on other things, one curve per
    # probe size (CacheCurve); () (an older profile): nothing is ever lost
    cache: tuple[CacheCurve, ...] = ()
    # issue 36: our GEMM's cache blocking measured fastest here ({"kc": depth of a K slice,
    # "mc": rows of A per packed block}); {} (not measured): the shipped blocks of gemm_tiles.py
    gemm_blocks: dict[str, int] = field(default_factory=dict)
    # issue 36: the convolutions' blocking measured fastest here ({"chunk_bytes": column
    # matrix bytes per chunk of images, "per_image_macs": the largest group product run one per
    # image}); {} (not measured): the shipped constants of codegen/runtime/conv_cpu.py
    conv_blocks: dict[str, int] = field(default_factory=dict)
    # issue 33: the fused attention's tiles measured fastest here ({"query": rows of q,
    # "key": keys per tile}); {} (not measured): ir/attention_op.py's shipped tiles
    attention_blocks: dict[str, int] = field(default_factory=dict)
    # the forward kernel's own tiles, timed alone (the same keys); {}: the shipped forward tiles
    attention_forward_blocks: dict[str, int] = field(default_factory=dict)
    # issue 33: the fused forward's seconds per (batch index, query block) task, fit over sizes
    # (calibration/attention_tiles.attention_task_seconds); 0 (not measured): the shipped one
    attention_task_seconds: float = 0.0
    # issue 36: our GEMM's time under each timed blocking relative to the fastest one
    # (geometric mean over calibrate's products): ((kc, mc, relative), ...); () (not measured):
    # every blocking priced alike (calibration/gemm_price.py)
    gemm_block_times: tuple[tuple[int, int, float], ...] = ()
    # issue 36: the longest row whose values a row kernel keeps rather than recomputes, measured
    # at the crossover here (calibration/row_crossover.py); 0 (not measured): the shipped limit
    row_scratch: int = 0
    version: int = PROFILE_VERSION  # of the `dlvm-eq calibrate` that measured it

    @property
    def stale(self) -> bool:
        """Measured before plan steps were timed (version 1): predictions of planned programs
        fall back to the profile's rates."""
        return not self.steps

    @property
    def outdated(self) -> bool:
        """Measured by an older `dlvm-eq calibrate` than this one (a recalibration measures more)."""
        return self.version < PROFILE_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ProfileError(f"not JSON: {e}") from None
        if not isinstance(data, dict) or data.get("version") not in READABLE_VERSIONS:
            raise ProfileError(f"not a version-{PROFILE_VERSION} profile")
        try:
            matmuls = tuple(
                MatmulPoint(
                    int(p["m"]),
                    int(p["k"]),
                    int(p["n"]),
                    _positive(p["seconds"]),
                    bool(p.get("trans_a", False)),
                    bool(p.get("trans_b", False)),
                )
                for p in data["matmuls"]
            )
            op_flops = {str(k): _positive(v) for k, v in data["op_flops"].items()}
            steps = {
                str(kind): tuple((_positive(size), _positive(t)) for size, t in grid)
                for kind, grid in data.get("steps", {}).items()
            }
            return cls(
                target=str(data["target"]),
                host=str(data["host"]),
                bandwidth=_positive(data["bandwidth"]),
                flop_rate=_positive(data["flop_rate"]),
                launch=_positive(data["launch"]),
                pool_wake=_non_negative(data["pool_wake"]),
                reduce_rate=_positive(data["reduce_rate"]),
                op_flops=op_flops,
                matmuls=matmuls,
                measured_at=str(data.get("measured_at", "")),
                seconds=_non_negative(data.get("seconds", 0.0)),
                steps=steps,
                program_call=_non_negative(data.get("program_call", 0.0)),
                step_call=_non_negative(data.get("step_call", 0.0)),
                cache=tuple(CacheCurve.from_data(c) for c in data.get("cache", ())),
                gemm_blocks=_blocks(data.get("gemm_blocks", {})),
                conv_blocks=_conv_blocks(data.get("conv_blocks", {})),
                attention_blocks=_blocks(data.get("attention_blocks", {}), ("query", "key")),
                attention_forward_blocks=_blocks(
                    data.get("attention_forward_blocks", {}), ("query", "key")
                ),
                attention_task_seconds=_non_negative(data.get("attention_task_seconds", 0.0)),
                gemm_block_times=tuple(
                    (int(kc), int(mc), _positive(r))
                    for kc, mc, r in data.get("gemm_block_times", ())
                ),
                row_scratch=int(_non_negative(data.get("row_scratch", 0))),
                version=int(data["version"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ProfileError(f"malformed profile ({type(e).__name__}: {e})") from None

    def digest(self) -> str:
        """Names the profile in cache keys: an extraction made under one profile is not reused
        under another."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


def _positive(v) -> float:
    x = float(v)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{v!r} is not a positive number")
    return x


def _blocks(d, keys=("kc", "mc")) -> dict[str, int]:
    """{keys[0]: n, keys[1]: n}, both whole numbers in [8, 4096], or {}."""
    if not d:
        return {}
    out = {k: int(d[k]) for k in keys}
    if set(d) != set(keys) or any(not 8 <= v <= 4096 or v != d[k] for k, v in out.items()):
        raise ValueError(f"{d!r} is not blocks ({' and '.join(keys)}, whole numbers in 8..4096)")
    return out


def _conv_blocks(d) -> dict[str, int]:
    """{"chunk_bytes": n, "per_image_macs": n}, both whole numbers in [2**10, 2**34], or {}."""
    if not d:
        return {}
    keys = ("chunk_bytes", "per_image_macs")
    out = {k: int(d[k]) for k in keys}
    if set(d) != set(keys) or any(not 1 << 10 <= v <= 1 << 34 or v != d[k] for k, v in out.items()):
        raise ValueError(f"{d!r} is not convolution blocks (chunk_bytes, per_image_macs)")
    return out


def _fractions(curve) -> tuple[tuple[float, float], ...]:
    """((amount, fraction), ...): amounts non-negative and increasing, fractions in [0, 1]."""
    out = tuple((_non_negative(a), _non_negative(f)) for a, f in curve)
    if any(f > 1 for _, f in out) or any(b[0] <= a[0] for a, b in zip(out, out[1:])):
        raise ValueError(f"{curve!r} is not a curve of increasing amounts and fractions in [0, 1]")
    return out


def _non_negative(v) -> float:
    x = float(v)
    if not (math.isfinite(x) and x >= 0):
        raise ValueError(f"{v!r} is not a non-negative number")
    return x


def host_id(target: str = "cpu") -> str:
    """The CPU model, architecture and usable CPU count: a profile is only valid where these
    match (the count because bandwidth and flop rates are measured over all cores); for the
    gpu target, also the CUDA device's name and compute capability."""
    cpu = _cpu_id()
    return cpu if target != "gpu" else f"{cpu} | {_gpu_id()}"


def _gpu_id() -> str:
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return f"{name} sm_{props['major']}{props['minor']}"
    except Exception:  # no CuPy, no driver, no device: no GPU profile matches
        return "no CUDA device"


def _cpu_id() -> str:
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{platform.machine()} {model} x{cpus}"


def profile_path(target: str) -> Path:
    return default_cache_dir() / "profiles" / f"{target}.json"


def write_profile(profile: Profile) -> Path:
    """Write atomically (a reader sees the old profile or the new one, never half of one)."""
    path = profile_path(profile.target)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(profile.to_json())
    os.replace(tmp, path)
    _LOADED.pop(profile.target, None)
    return path


_LOADED: dict[str, Profile | None] = {}


def load_profile(target: str) -> Profile | None:
    """This host's profile for `target`, or None (no file; or a corrupt or foreign one, with a
    warning, so that compiling goes on with the shipped defaults)."""
    if target in _LOADED:
        return _LOADED[target]
    path = profile_path(target)
    profile = None
    try:
        text = path.read_text()
    except FileNotFoundError:
        text = None
    except OSError as e:
        warnings.warn(f"cannot read the machine profile {path} ({e}); using the default cost model")
        text = None
    if text is not None:
        try:
            profile = Profile.from_json(text)
        except ProfileError as e:
            warnings.warn(
                f"ignoring the machine profile {path}: {e}; using the default cost model "
                f"(run `dlvm-eq calibrate` to measure a new one)"
            )
        else:
            if profile.host != host_id(target) or profile.target != target:
                warnings.warn(
                    f"ignoring the machine profile {path}: measured on {profile.host!r}, "
                    f"this is {host_id(target)!r}; run `dlvm-eq calibrate` here"
                )
                profile = None
    if profile is not None and profile.stale:
        warnings.warn(
            f"the machine profile {path} is stale (measured by an older `dlvm-eq "
            f"calibrate`, without plan step timings): predicted program times use its "
            f"rates only; run `dlvm-eq calibrate` again"
        )
    elif profile is not None and profile.outdated:
        warnings.warn(
            f"the machine profile {path} was measured by an older `dlvm-eq calibrate` "
            f"(profile version {profile.version}, this is {PROFILE_VERSION}: "
            f"{_MISSING[profile.version]}); run `dlvm-eq calibrate` again"
        )
    _LOADED[target] = profile
    return profile


def forget_profiles() -> None:
    """Read the profiles again on next use (after the cache directory changed)."""
    _LOADED.clear()
