"""One MLP training step (batch 256, 784 -> 256 -> 10, ReLU, mean softmax cross-entropy, SGD
update included): dlvm_eq against a hand-written numpy step, PyTorch eager, torch.compile and
JAX, side by side in one run; plus dlvm_eq's cold and warm-cache compile times.

    .venv/bin/python benchmarks/mlp_step.py                          # prints the tables
    .venv/bin/python benchmarks/mlp_step.py --update BENCHMARKS.md   # and writes its section

Peers come from the `bench` extra (`pip install -e '.[bench]'`); a missing one is noted and
skipped. Every implementation's loss, gradients and updated parameters are checked against a
float64 numpy reference before anything is timed. Step times are medians over
--rounds x --steps steps after warm-up, the implementations taking turns round by round.
OpenBLAS's OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE overrides are removed (the script restarts
itself without them) because they select slower matmul kernels on this machine.
Compile times are measured in fresh processes with $DLVM_EQ_CACHE_DIR set to a new empty
folder (cold) and then to the same folder again (warm).

`--target gpu` keeps every array on the device (CuPy) and compares against the same
hand-written step on CuPy arrays and cuBLAS's five matmuls (scripts/gpu-check runs it); it
writes its own section, `## MLP training step (gpu)`.

Extra rows give context: dlvm_eq with the SGD update inside the jitted function (as the JAX
row is written), and the step's five matmuls alone, through numpy's OpenBLAS (the floor for a
step that calls that BLAS, as the numpy step does) and through dlvm_eq's own GEMM (what its CPU
target calls).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import reexec_without

UNSET = reexec_without()  # before numpy loads OpenBLAS

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

from common import Timing, machine_line, markdown_table, median_time, timing_table, update_section  # noqa: E402
from mlp_step_impls import (  # noqa: E402
    LR,
    MATMULS,
    OUR_MATMULS,
    DlvmEq,
    DlvmEqUpdateInside,
    Implementation,
    Jax,
    MatmulsOnly,
    NumpyHandWritten,
    OurMatmulsOnly,
    Torch,
    check,
    data,
    pick_target,
    reference,
)

SECTION = "## MLP training step"


# ---------------------------------------------------------------- compile time (subprocess)


def compile_probe(target: str) -> None:
    """In a fresh process: time `import dlvm_eq` and the jitted step's first call."""
    t0 = time.perf_counter()
    import dlvm_eq  # noqa: F401

    t1 = time.perf_counter()
    params, x, y = data()
    t2 = time.perf_counter()
    ran, fn, _ = pick_target(target, (*params, x, y))  # traces, differentiates, compiles, runs once
    t3 = time.perf_counter()
    steady = median_time(lambda: fn(*params, x, y), repeats=10, warmup=1).median
    print(
        json.dumps(
            {"import_s": t1 - t0, "first_call_s": t3 - t2, "steady_s": steady, "target": ran}
        )
    )


def measure_compile(target: str, repeats: int) -> dict:
    """Median cold and warm first-call times over `repeats` (cold, warm) pairs of processes.
    dlvm_eq's bytecode is compiled first, as `pip install` does for an installed package (an
    editable install has none, and with PYTHONDONTWRITEBYTECODE set every process would
    recompile the package's source: ~25 ms that is Python's, not the compiler's)."""
    import compileall

    import dlvm_eq

    compileall.compile_dir(str(Path(dlvm_eq.__file__).parent), quiet=1)
    cold, warm, imports, ran = [], [], [], None
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="dlvm_eq_cache_") as cache:
            env = dict(os.environ, DLVM_EQ_CACHE_DIR=cache)
            for into in (cold, warm):
                proc = subprocess.run(
                    [sys.executable, __file__, "--compile-probe", "--target", target],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=600,
                )
                if proc.returncode != 0:
                    raise RuntimeError(f"compile probe failed:\n{proc.stderr[-2000:]}")
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                into.append(r["first_call_s"] - r["steady_s"])
                imports.append(r["import_s"])
                ran = r["target"]
    return {
        "cold_s": statistics.median(cold),
        "warm_s": statistics.median(warm),
        "import_s": statistics.median(imports),
        "target": ran,
        "repeats": repeats,
    }


# ---------------------------------------------------------------- main

PEERS = ("numpy", "torch", "torch.compile", "jax")


def peers(params, x, y, notes: list[str], skip=(), target: str = "cpu") -> list[Implementation]:
    out: list[Implementation] = []
    cpu_only = ("torch", "torch.compile", "jax") if target == "gpu" else ()
    if cpu_only:  # the bench extra's PyTorch and JAX are CPU builds: compared on cpu
        notes.append(
            "gpu target: the hand-written step and the matmuls run on CuPy; PyTorch and "
            "JAX (CPU builds in the bench extra) are compared on the cpu target"
        )
    if "numpy" not in skip:
        out.append(MatmulsOnly(params, x, y, target))
        if target == "cpu":
            out.append(OurMatmulsOnly(params, x, y, target))
    for key, label, make in (
        ("numpy", "numpy hand-written", lambda: NumpyHandWritten(params, x, y, target)),
        ("torch", "PyTorch eager", lambda: Torch(params, x, y, compiled=False)),
        ("torch.compile", "torch.compile", lambda: Torch(params, x, y, compiled=True)),
        ("jax", "JAX", lambda: Jax(params, x, y)),
    ):
        if key in cpu_only:
            continue
        if key in skip:
            notes.append(f"{label}: skipped (--skip {key})")
            continue
        try:
            out.append(make())
        except ImportError as e:
            notes.append(
                f"{label}: not installed ({e.name or e}); skipped. "
                "Install the bench extra: pip install -e '.[bench]'"
            )
        except Exception as e:
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            notes.append(f"{label}: failed to set up ({last[:300]}); skipped")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="cpu", help="dlvm_eq's jit target (default cpu)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per round (default 50)")
    ap.add_argument(
        "--skip", action="append", default=[], choices=PEERS, help="leave out a peer (repeatable)"
    )
    ap.add_argument("--rounds", type=int, default=5, help="rounds, implementations taking turns")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument(
        "--compile-repeats",
        type=int,
        default=3,
        help="(cold, warm) pairs of fresh processes for compile time; 0 skips",
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for the 1-minute load average to fall below 1",
    )
    ap.add_argument(
        "--update", type=Path, help="write the results into this markdown file's section"
    )
    ap.add_argument("--compile-probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps < 2 or args.rounds < 1:
        ap.error("--steps must be at least 2 (a median and quartiles) and --rounds at least 1")
    if args.compile_probe:
        compile_probe(args.target)
        return 0

    if UNSET:
        print(
            "environment: unset "
            + ", ".join(f"{k} (was {v!r})" for k, v in UNSET.items())
            + " and restarted, so that OpenBLAS picks its kernels for this CPU"
        )
    else:
        print("environment: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE not set (nothing to unset)")
    wait_for_idle(args.wait_idle)
    load = os.getloadavg()[0]  # before this run adds its own
    print(f"machine: {machine_line()}; load average {load:.2f}")
    busy = busy_warning(load)

    params, x, y = data()
    notes: list[str] = []
    ours = DlvmEq(params, x, y, args.target)
    if ours.target != args.target:
        print(f"NOTE: dlvm_eq ran on target {ours.target!r}, not {args.target!r}")
    if ours.detail:
        notes.append(f"dlvm_eq: {ours.detail}")
    if ours.report:
        print(ours.report)
    impls = [ours]
    try:
        impls.append(DlvmEqUpdateInside(params, x, y, ours.target))
    except Exception as e:
        notes.append(
            f"dlvm_eq, SGD inside the jit: failed ({str(e).strip().splitlines()[0][:300]})"
        )
    impls += peers(params, x, y, notes, args.skip, ours.target)

    ref = reference(params, x, y)
    checked = []
    for impl in impls:
        if impl.reference_only:
            checked.append(impl)
            continue
        problem = check(impl, ref)
        what = (
            "loss and SGD step" if impl.value_and_grad is None else "loss, gradients and SGD step"
        )
        print(
            f"check {impl.name}: "
            + (f"{what} agree with float64 numpy" if problem is None else f"WRONG: {problem}")
        )
        if problem is None:
            checked.append(impl)
        else:
            notes.append(f"{impl.name}: excluded, result disagrees with the reference ({problem})")
    if ours not in checked:
        print("dlvm_eq's result is wrong; not timing anything")
        return 1

    samples: dict[str, list[float]] = {impl.name: [] for impl in checked}
    for r in range(args.rounds):
        order = checked if r % 2 == 0 else checked[::-1]
        for impl in order:
            time.sleep(0.2)  # let the previous library's worker threads go idle
            t = median_time(impl.step, repeats=args.steps, warmup=args.warmup, sync=impl.sync)
            samples[impl.name].append(t)
    timings = {name: combine(ts) for name, ts in samples.items()}
    for name, ts in samples.items():
        print(f"rounds, median ms: {name}: " + " ".join(f"{t.ms:.3f}" for t in ts))

    rows = [{"name": i.name, "timing": timings.get(i.name), "note": i.note} for i in impls]
    table = timing_table(rows, baseline=ours.name, ratio_header=f"time / {ours.name}")
    print()
    print(table)

    compile_info = None
    if args.compile_repeats > 0:
        compile_info = measure_compile(args.target, args.compile_repeats)
        print()
        print(compile_table(compile_info))
    print()
    if busy:
        notes.append(busy)
    verdicts = targets(timings, ours.name, compile_info)
    for line in verdicts:
        print(line)
    for n in notes:
        print("note: " + n)

    if args.update:
        command = "python benchmarks/mlp_step.py " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        heading = section_heading(ours.target)
        update_section(
            args.update,
            heading,
            section_text(command.strip(), table, compile_info, verdicts, notes, ours, load),
        )
        print(f"wrote {heading!r} in {args.update}")
    return 0


def wait_for_idle(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while os.getloadavg()[0] >= 1.0 and time.monotonic() < deadline:
        time.sleep(5)


def busy_warning(load: float) -> str | None:
    """Other processes on the CPUs stall multi-threaded BLAS: a GEMM waits for a descheduled
    worker for a whole scheduler period (seen here: x @ w1 at 24-48 ms instead of 0.4)."""
    cores = os.cpu_count() or 1
    if load < 0.5 * cores:
        return None
    text = (
        f"the machine is busy (load average {load:.2f} on {cores} cores): other processes "
        "stall multi-threaded steps, so these timings are noisy; rerun on an idle machine "
        "(--wait-idle 600 waits for one)"
    )
    print("WARNING: " + text)
    return text


def combine(timings: list[Timing]) -> Timing:
    """One Timing from several rounds: median of the round medians, quartiles likewise."""
    return Timing(
        statistics.median(t.median for t in timings),
        statistics.median(t.q1 for t in timings),
        statistics.median(t.q3 for t in timings),
        sum(t.repeats for t in timings),
    )


def compile_table(info: dict) -> str:
    return markdown_table(
        ["dlvm_eq compile (fresh process)", "seconds", "target"],
        [
            ["cold: empty kernel cache", f"{info['cold_s']:.3f}", "<= 1 s"],
            ["warm: same cache, new process", f"{info['warm_s']:.3f}", "<= 0.1 s"],
            ["(import dlvm_eq, not included)", f"{info['import_s']:.3f}", ""],
        ],
    )


def targets(timings: dict, ours: str, compile_info: dict | None) -> list[str]:
    """The issue's targets, each with its verdict."""
    out = []
    mine = timings.get(ours)
    jax_t = timings.get("JAX jit(value_and_grad)")
    np_t = timings.get("numpy hand-written")
    if mine and jax_t:
        out.append(
            f"target step time <= JAX's: {mine.ms:.3f} ms vs {jax_t.ms:.3f} ms -> "
            f"{'met' if mine.median <= jax_t.median else 'NOT met'}"
        )
    if mine and np_t:
        speedup = np_t.median / mine.median
        out.append(
            f"target >= 1.5x faster than numpy hand-written: {speedup:.2f}x -> "
            f"{'met' if speedup >= 1.5 else 'NOT met'}"
        )
    floor, own = timings.get(MATMULS), timings.get(OUR_MATMULS)
    if mine and np_t and floor:
        text = (
            f"(for the 1.5x target: 1.5x faster than numpy is {np_t.ms / 1.5:.3f} ms; the 5 "
            f"matmuls alone take {floor.ms:.3f} ms through numpy's OpenBLAS"
        )
        if own:
            text += f", {own.ms:.3f} ms through dlvm_eq's GEMM"
        best = min(t.median for t in (floor, own) if t)
        text += (
            f": the target is {'below' if np_t.median / 1.5 < best else 'above'} the faster of "
            f"them; dlvm_eq spends {mine.ms - (own if own and ours_used() else floor).ms:.3f} ms "
            f"beyond its matmuls, "
            f"numpy {np_t.ms - floor.ms:.3f} ms beyond its)"
        )
        out.append(text)
    if compile_info:
        out.append(
            f"target cold compile <= 1 s: {compile_info['cold_s']:.3f} s -> "
            f"{'met' if compile_info['cold_s'] <= 1.0 else 'NOT met'}"
        )
        out.append(
            f"target warm-cache compile <= 100 ms: {compile_info['warm_s'] * 1e3:.0f} ms -> "
            f"{'met' if compile_info['warm_s'] <= 0.1 else 'NOT met'}"
        )
    return out


def ours_used() -> bool:
    """Whether compiled CPU code runs its products through our GEMM on this host."""
    from dlvm_eq.codegen.runtime import gemm_runtime

    return gemm_runtime.enabled()


def section_heading(target: str) -> str:
    """The BENCHMARKS.md section a run writes: one per target, so a GPU run keeps the CPU one."""
    return SECTION if target == "cpu" else f"{SECTION} ({target})"


def section_text(command, table, compile_info, verdicts, notes, ours, load) -> str:
    env = (
        "OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE were unset for the run (the script restarts "
        "itself without them)"
        if UNSET
        else "OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE were not set"
    )
    parts = [
        section_heading(ours.target),
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine_line()}; measured {datetime.date.today().isoformat()}, load average "
        f"{load:.2f} before the run. {env}.",
        "",
        "One training step: batch 256, 784 -> 256 -> 10, ReLU, mean softmax cross-entropy, SGD "
        f"(lr {LR}) update included. Loss, gradients and one updated step of every implementation "
        "were checked against float64 numpy before timing. Median over rounds x steps after "
        "warm-up, the implementations taking turns; IQR is the interquartile range of a round.",
        "",
        table,
        "",
    ]
    if ours.target != "cpu":
        parts += [
            f"**dlvm_eq ran on target `{ours.target}`**, not the CPU code generator; "
            "see the notes.",
            "",
        ]
    if ours.report:
        parts += ["What dlvm_eq compiled (`step.report(...)`):", "", "```", ours.report, "```", ""]
    if compile_info:
        parts += [
            "Compile time: the jitted step's first call (trace, differentiate and optimize "
            "in the e-graph, generate kernels) minus one steady step, in a fresh process "
            f"after `import dlvm_eq`; median of {compile_info['repeats']} (cold, warm) pairs; "
            "dlvm_eq's bytecode compiled beforehand, as `pip install` does.",
            "",
            compile_table(compile_info),
            "",
        ]
    parts += ["Targets (issue 6):", ""] + [f"- {v}" for v in verdicts]
    if notes:
        parts += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.exit(main())
