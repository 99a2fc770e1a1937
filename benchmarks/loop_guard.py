"""What the never-slower guard costs a function with loops: the GRU value-and-gradient of
benchmarks/rnn.py (dq.scan, batch 16, hidden 64; or a tanh RNN, batch 4, hidden 16, whose
rewrites are no stability rewrites) compiled with the guard on and off, each in a fresh
process: cold (an empty cache directory), then warm (a second process on the directory the
cold one filled); trees and modes take turns round by round. Printed: the compile's wall
seconds, and how many plans it made (pipeline/planning.plan_function) in how many seconds.

    .venv/bin/python benchmarks/loop_guard.py                           # this tree
    .venv/bin/python benchmarks/loop_guard.py --trees /old/checkout .   # before/after
    .venv/bin/python benchmarks/loop_guard.py --program tanh --steps 8 64 --rounds 3
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

# One measurement: argv = tree, steps, guard|noguard, gru|tanh. Prints one JSON line.
CHILD = r"""
import json, sys, time
import numpy as np
tree, steps, mode, program = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
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
if program == "gru":
    args, f = rnn._data(steps), rnn._dq_program("dq-scan")
else:
    import dlvm_eq as dq
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 16)) * 0.3).astype(np.float32)
    u = (rng.standard_normal((16, 16)) * 0.3).astype(np.float32)
    def loss(w, u, h0, xs):
        step = lambda h, x: (lambda h: (h, h))(dq.tanh(x @ w + h @ u))
        return dq.mean(dq.scan(step, h0, xs)[1] ** 2)
    xs = rng.standard_normal((steps, 4, 8)).astype(np.float32)
    args, f = (w, u, np.zeros((4, 16), np.float32), xs), dq.jit(dq.value_and_grad(loss, (0, 1)))
t0 = time.perf_counter()
f(*args)
wall = time.perf_counter() - t0
print(json.dumps({"compile_s": wall, "plans": len(seconds), "plan_s": sum(seconds)}))
"""


def measure(tree: str, steps: int, mode: str, program: str) -> list[dict]:
    """[cold, warm] measurements."""
    out = []
    with tempfile.TemporaryDirectory(prefix="dlvm_eq-loop-guard-") as cache:
        env = dict(os.environ, DLVM_EQ_CACHE_DIR=cache, OPENBLAS_NUM_THREADS="1")
        argv = [sys.executable, "-c", CHILD, str(Path(tree).resolve()), str(steps), mode, program]
        for _ in range(2):
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=[str(HERE.parent)])
    ap.add_argument("--steps", nargs="+", type=int, default=[8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--program", choices=("gru", "tanh"), default="gru")
    a = ap.parse_args()
    for r in range(a.rounds):
        for steps in a.steps:
            for tree in a.trees:
                for mode in ("guard", "noguard"):
                    cold, warm = measure(tree, steps, mode, a.program)
                    load = os.getloadavg()[0]
                    print(
                        f"round {r + 1} {a.program} T={steps} {tree} {mode}: "
                        f"cold {cold['compile_s']:.2f} s, {cold['plans']} plans in "
                        f"{cold['plan_s']:.2f} s; warm {warm['compile_s']:.2f} s, "
                        f"{warm['plans']} plans in {warm['plan_s']:.2f} s (load {load:.1f})",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
