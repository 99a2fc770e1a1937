"""`dlvm-eq calibrate`: time this machine, so that the cost model prices e-nodes by what they
take here (Tensat's measured operator costs), and store the result as a profile.

    profile = calibrate("cpu")        # about 16 s here; writes <cache dir>/profiles/cpu.json
    profile = calibrate("gpu")        # the current CUDA device; <cache dir>/profiles/gpu.json
    print(profile_table(profile))

It may import codegen (to build the kernels it times) and extract (the profile's data type);
nothing below imports it: the cost model reads the stored profile, not this package.
"""

from __future__ import annotations

import datetime
import time

from ..errors import DlvmError
from ..extract.machine import MACHINES, from_profile
from ..extract.profile import Profile, host_id, write_profile
from . import measure, measure_steps, program_state
from .attention_tiles import attention_blocks, attention_forward_blocks, attention_task_seconds
from .row_crossover import row_scratch


def calibrate(target: str = "cpu", write: bool = True) -> Profile:
    """Measure `target` on this host (the gpu: the current CUDA device); write the profile to
    the cache directory unless told not to."""
    if target == "gpu":
        return _calibrate_gpu(write)
    if target != "cpu":
        raise DlvmError(f"unknown calibration target {target!r}; expected cpu or gpu")
    t0 = time.perf_counter()
    got: dict = {}

    def rates():
        got["flop_rate"] = rate = measure.flop_rate()
        got["launch"], got["pool_wake"] = measure.launch_overheads()
        got.update(
            bandwidth=measure.bandwidth(),
            reduce_rate=measure.reduce_rate(),
            op_flops=measure.op_flops(rate),
        )

    def steps():
        got["program_call"], got["step_call"] = measure_steps.call_overheads()
        got["steps"] = measure_steps.kind_grids(got["step_call"])

    # the products' sweeps with the other measurements between them, seconds apart
    matmuls = tuple(measure.matmuls(passes=3, between=(rates, steps)))
    profile = Profile(
        target=target,
        host=host_id(),
        matmuls=matmuls,
        measured_at=_now(),
        **{
            k: got[k]
            for k in (
                "bandwidth",
                "flop_rate",
                "launch",
                "pool_wake",
                "reduce_rate",
                "op_flops",
                "program_call",
                "step_call",
            )
        },
    )
    # windows last: timed beyond their products, priced by the products above
    windows = measure_steps.window_grids(
        from_profile(Profile(**{**profile.__dict__, "steps": got["steps"]}), MACHINES[target]),
        got["step_call"],
    )
    profile = Profile(
        **{
            **profile.__dict__,
            "steps": {**got["steps"], **windows},
            "cache": program_state.cache_timings(),
            # issue 36: our GEMM's fastest blocking, and each blocking's time (gemm_price.py)
            "gemm_blocks": (gemm := measure.gemm_block_choice())[0],
            "gemm_block_times": gemm[1],
            "row_scratch": row_scratch(),  # the row length where keeping stops paying
            "conv_blocks": measure.conv_blocks(),  # and the convolutions'
            "attention_blocks": attention_blocks(),  # issue 33: the fused attention's tiles
            "attention_forward_blocks": (fwd := attention_forward_blocks()),  # the forward's alone
            # and a fused forward task's fixed cost on those tiles, fit over sizes
            "attention_task_seconds": attention_task_seconds((fwd["query"], fwd["key"])),
            "seconds": round(time.perf_counter() - t0, 2),
        }
    )
    if write:
        write_profile(profile)
    return profile


def _calibrate_gpu(write: bool) -> Profile:
    """The CPU's measurements on the current CUDA device (measure_gpu.py), with the plan steps
    timed as GpuProgram runs them. Not measured there: the pool wake-up (there is none) and
    the caches' losses (every step is priced with its data where the last step left it)."""
    from ..codegen.gpu.gpu_runtime import cupy_module
    from . import measure_gpu

    cp = cupy_module()  # GpuUnavailable (a DlvmError) says why there is no GPU
    t0 = time.perf_counter()
    rates = measure_gpu.gpu_rates(cp)
    profile = Profile(
        target="gpu",
        host=host_id("gpu"),
        pool_wake=0.0,
        matmuls=tuple(measure_gpu.gpu_matmuls(cp)),
        measured_at=_now(),
        **rates,
    )
    call, step = measure_steps.call_overheads("gpu")
    steps = measure_steps.step_grids(
        from_profile(profile, MACHINES["gpu"]),
        step,
        measure_steps.GPU_SIZES,
        measure_steps.WINDOW_SIZES,
        target="gpu",
    )
    profile = Profile(
        **{
            **profile.__dict__,
            "steps": steps,
            "program_call": call,
            "step_call": step,
            "seconds": round(time.perf_counter() - t0, 2),
        }
    )
    if write:
        write_profile(profile)
    return profile


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def profile_table(p: Profile) -> str:
    """The profile as a reader wants it: rates with units, then the products."""
    lines = [
        f"machine profile ({p.target}) of {p.host}, measured {p.measured_at} in {p.seconds:.1f} s",
        f"  bandwidth     {p.bandwidth / 1e9:8.1f} GB/s   (streaming map, read + write)",
        f"  elementwise   {p.flop_rate / 1e9:8.1f} GFLOP/s (multiply-add chain, in cache)",
        f"  reductions    {p.reduce_rate / 1e9:8.2f} G elements/s",
        f"  kernel call   {p.launch * 1e6:8.2f} us; waking the pool +{p.pool_wake * 1e6:.2f} us",
        f"  attention     {p.attention_task_seconds * 1e6:8.2f} us a fused forward task",
        "  op classes (flops per element): "
        + ", ".join(f"{op} {v:.0f}" for op, v in sorted(p.op_flops.items())),
        "  products (m x k x n, layout: seconds, GFLOP/s):",
    ]
    for q in p.matmuls:
        layout = ("T" if q.trans_a else "N") + ("T" if q.trans_b else "N")
        lines.append(
            f"    {q.m:5d} x {q.k:5d} x {q.n:5d} {layout}: {q.seconds * 1e6:10.1f} us "
            f"{q.flops / q.seconds / 1e9:8.1f}"
        )
    if p.stale:
        lines.append("  plan steps: not measured (an older profile): run `dlvm-eq calibrate` again")
        return "\n".join(lines)
    lines.append(
        f"  program call  {p.program_call * 1e6:8.2f} us; per step +{p.step_call * 1e6:.2f} us"
    )
    for c in p.cache:
        lines.append(
            f"  a {_bytes(c.probe_bytes)} buffer the caches lost: +{c.miss_seconds * 1e12:.1f} ps per byte; "
            "lost after "
            + ", ".join(f"{_bytes(b)} moved: {f:.0%}" for b, f in c.by_bytes[1:])
            + "; after "
            + ", ".join(f"{t * 1e3:g} ms: {f:.0%}" for t, f in c.by_seconds[1:])
        )
    lines.append("  plan steps (bytes moved: seconds):")
    for kind, grid in sorted(p.steps.items()):
        lines.append(
            f"    {kind:<20} " + ", ".join(f"{_bytes(b)}: {t * 1e6:.1f} us" for b, t in grid)
        )
    return "\n".join(lines)


def _bytes(n: float) -> str:
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


__all__ = ["calibrate", "profile_table"]
