"""OpenBLAS's threaded calls on OpenBLAS's own threads (the default) against the native worker
pool (DLVM_EQ_BLAS_POOL=1, runtime/blas_threads.py), for the training steps of
benchmarks/egraph_value.py's models (algebra on: the programs users run).

    .venv/bin/python benchmarks/blas_pool.py                         # prints the table
    .venv/bin/python benchmarks/blas_pool.py --update BENCHMARKS.md  # and writes its section

The setting is per process (the callback is installed when the pool starts), so every figure
comes from a fresh process (`--probe MODEL SETTING`: compile, warm up, median of --batches
batches of --calls steps); the two settings take turns round by round, and a model's ratio is
the median over rounds of (OpenBLAS's threads / the pool), so slow drifts of the machine hit
both alike. Quiet, and "busy": one process spinning on the last CPU (common.Busy) while both
settings' probes of a round run.
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed (the script restarts itself without them).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import reexec_without

UNSET = reexec_without()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from common import Busy, machine_line, markdown_table, update_section  # noqa: E402

HEADING = "## OpenBLAS's threads or the native pool"


def probe(name: str, batches: int, calls: int) -> None:
    import egraph_value as ev

    import dlvm_eq as dq
    from dlvm_eq.codegen.runtime import blas_threads

    model = next(m for m in ev.MODELS if m.__name__ == name)
    title, program, fname, args = ev.build(model, algebra=True)
    step = dq.compile(program, fname, target="cpu", optimize=True)
    for _ in range(10):
        step(*args)
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            step(*args)
        times.append((time.perf_counter() - t0) / calls)
    print(f"{statistics.median(times)!r} {int(blas_threads.installed())}")


def run_probe(name: str, setting: str, args) -> float | None:
    """Seconds per step from a fresh process with DLVM_EQ_BLAS_POOL=setting (None: it failed)."""
    env = dict(os.environ, DLVM_EQ_BLAS_POOL=setting)
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--probe",
            name,
            setting,
            "--batches",
            str(args.batches),
            "--calls",
            str(args.calls),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        print(out.stderr[-2000:], file=sys.stderr)
        return None
    value, installed = out.stdout.split()[-2:]
    if installed != setting:
        print(
            f"{name}: DLVM_EQ_BLAS_POOL={setting} but the callback installed={installed}",
            file=sys.stderr,
        )
        return None
    return float(value)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--only", nargs="+")
    ap.add_argument("--update", type=Path)
    ap.add_argument("--probe", nargs=2, metavar=("MODEL", "SETTING"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        probe(args.probe[0], args.batches, args.calls)
        return 0
    import egraph_value as ev

    names = args.only or [m.__name__ for m in ev.MODELS]
    conditions = ("quiet", "busy")
    seconds = {(n, c, s): [] for n in names for c in conditions for s in "01"}
    for _ in range(args.rounds):
        for name in names:
            for condition in conditions:
                with Busy() if condition == "busy" else contextlib.nullcontext():
                    for setting in "01":
                        value = run_probe(name, setting, args)
                        if value is None:
                            return 1
                        seconds[name, condition, setting].append(value)
    rows = []
    for name in names:
        row = [name]
        for condition in conditions:
            off, on = seconds[name, condition, "0"], seconds[name, condition, "1"]
            ratios = [a / b for a, b in zip(off, on)]
            row += [
                f"{statistics.median(off) * 1e3:.3f}",
                f"{statistics.median(on) * 1e3:.3f}",
                f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
            ]
        rows.append(row)
    load = os.getloadavg()[0]
    unset = f"; removed {', '.join(UNSET)}" if UNSET else ""
    text = (
        f"{HEADING}\n\n`.venv/bin/python benchmarks/blas_pool.py --update BENCHMARKS.md` "
        f"({datetime.date.today()}; {machine_line()}; load average {load:.2f} before the "
        f"summary{unset}). {args.rounds} rounds; in each, every model's two settings in fresh "
        f"processes, quiet and then with one process spinning on the last CPU (busy); a "
        f"process's figure is the median of {args.batches} batches of {args.calls} steps; "
        f"speedup = OpenBLAS's threads / the pool.\n\n"
        + markdown_table(
            [
                "model",
                "quiet: OpenBLAS's threads ms",
                "native pool ms",
                "speedup (median of rounds; range)",
                "busy: OpenBLAS's threads ms",
                "native pool ms",
                "speedup (median of rounds; range)",
            ],
            rows,
        )
    )
    print(text)
    if args.update:
        update_section(args.update, HEADING, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
