"""The dlvm_eq training steps of benchmarks/models.py (CNN, transformer) from two source trees,
side by side: each round runs every model once per tree, each in a fresh process (its own
kernel cache), alternating the trees, one thread (OPENBLAS_NUM_THREADS, DLVM_EQ_NUM_THREADS).
A figure is the median of 45 steps after 3 warm-up steps; the load average is printed beside it.

    python benchmarks/models_before_after.py /path/to/before /path/to/after --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ONE_SIDE = """
import sys, time, statistics
sys.path[:0] = [{root!r}, {root!r} + "/benchmarks"]
import dlvm_eq, models
assert dlvm_eq.__file__.startswith({root!r}), dlvm_eq.__file__
m = models.MODELS[{model!r}]
impl = models.DlvmEq(m, m.params(), *m.data())
for _ in range(3):
    impl.step()
ts = []
for _ in range(45):
    t = time.perf_counter(); impl.step(); ts.append(time.perf_counter() - t)
print(statistics.median(ts))
"""


def one(root: str, model: str, cache: str) -> float:
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",
        "DLVM_EQ_NUM_THREADS": "1",
        "DLVM_EQ_CACHE_DIR": cache,
    }
    out = subprocess.run(
        [sys.executable, "-c", ONE_SIDE.format(root=root, model=model)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=["transformer", "cnn"])
    args = ap.parse_args(argv)
    roots = [str(Path(args.before).resolve()), str(Path(args.after).resolve())]
    ratios: dict[str, list[float]] = {m: [] for m in args.models}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for model in args.models:
                ms = []
                for i, root in enumerate(roots):
                    load = os.getloadavg()[0]
                    ms.append(one(root, model, f"{tmp}/{i}") * 1e3)
                    print(f"round {r + 1} {model} {root}: {ms[-1]:.2f} ms (load {load:.2f})")
                ratios[model].append(ms[1] / ms[0])
    for model, rs in ratios.items():
        print(f"{model}: after / before, median of paired ratios {statistics.median(rs):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
