"""What the never-slower guard costs a function with loops: the GRU value-and-gradient of
benchmarks/rnn.py (dq.scan, batch 16, hidden 64) compiled cold, with the guard on and off, in
fresh processes with empty caches, trees and modes taking turns round by round. Printed: the
compile's wall seconds, and how many plans it made (pipeline/planning.plan_function) in how
many seconds.

    .venv/bin/python benchmarks/loop_guard.py                           # this tree
    .venv/bin/python benchmarks/loop_guard.py --trees /old/checkout .   # before/after
    .venv/bin/python benchmarks/loop_guard.py --steps 8 64 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# One measurement: argv = tree, steps, guard|noguard. Prints one JSON line.
CHILD = r"""
import json, sys, time
tree, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path[:0] = [tree, tree + "/benchmarks"]
import dlvm_eq, rnn
from dlvm_eq.pipeline import never_slower, planning
seconds = []
real = planning.plan_function
def timed(*a, **k):
    t = time.perf_counter()
    out = real(*a, **k)
    seconds.append(time.perf_counter() - t)
    return out
planning.plan_function = timed
if mode == "noguard":
    never_slower.guard_for = lambda target: None
args = rnn._data(steps)
t0 = time.perf_counter()
rnn._dq_program("dq-scan")(*args)
wall = time.perf_counter() - t0
print(json.dumps({"compile_s": wall, "plans": len(seconds), "plan_s": sum(seconds)}))
"""


def measure(tree: str, steps: int, mode: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="dlvm_eq-loop-guard-") as cache:
        env = dict(os.environ, DLVM_EQ_CACHE_DIR=cache, OPENBLAS_NUM_THREADS="1")
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(Path(tree).resolve()), str(steps), mode],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=[str(HERE.parent)])
    ap.add_argument("--steps", nargs="+", type=int, default=[8])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    for r in range(a.rounds):
        for steps in a.steps:
            for tree in a.trees:
                for mode in ("guard", "noguard"):
                    m = measure(tree, steps, mode)
                    load = os.getloadavg()[0]
                    print(
                        f"round {r + 1} T={steps} {tree} {mode}: compile {m['compile_s']:.2f} s, "
                        f"{m['plans']} plans in {m['plan_s']:.2f} s (load {load:.1f})",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
