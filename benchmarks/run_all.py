"""Every benchmark, one after another, each writing its section of BENCHMARKS.md (`make bench`).

    .venv/bin/python benchmarks/run_all.py            # all of them (about 30 minutes)
    .venv/bin/python benchmarks/run_all.py --only mlp_step softmax
    .venv/bin/python benchmarks/run_all.py --no-write # print only

Each runs in its own process (they set up OpenBLAS's environment and thread pools their own way).
A benchmark that fails is reported and the others still run; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPORT = HERE.parent / "BENCHMARKS.md"

# name -> (arguments, arguments that write its section)
BENCHMARKS = {
    "extraction_gym": ([], ["--update", str(REPORT)]),
    "mlp_grad_flops": ([], []),
    "optimize_compile_time": ([], ["--write"]),
    "elementwise": ([], ["--update", str(REPORT)]),
    "softmax": ([], ["--update", str(REPORT)]),
    "mlp_step": ([], ["--update", str(REPORT)]),
    "contention": ([], ["--update", str(REPORT)]),
    "data_parallel": ([], ["--update", str(REPORT)]),
    "egraph_value": ([], ["--update", str(REPORT)]),
    "blas_pool": ([], ["--update", str(REPORT)]),
    "models": ([], ["--update", str(REPORT)]),
    "deep_programs": ([], ["--update", str(REPORT)]),  # ~15 minutes: 100k instructions
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these")
    ap.add_argument(
        "--no-write", action="store_true", help="print the tables, leave BENCHMARKS.md alone"
    )
    args = ap.parse_args(argv)
    failed = []
    for name in args.only or list(BENCHMARKS):
        base, write = BENCHMARKS[name]
        cmd = [sys.executable, str(HERE / f"{name}.py"), *base, *([] if args.no_write else write)]
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        if subprocess.run(cmd).returncode != 0:
            failed.append(name)
        print(f"=== {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
