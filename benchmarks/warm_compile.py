"""Warm compiles (the disk cache filled, a fresh process) of the MLP, CNN and transformer steps,
split so that load matters less: the compile's phases without the step's first run (and the
lazy imports among them), the main thread's CPU time, modules loaded and peak RSS.

    .venv/bin/python benchmarks/warm_compile.py --trees /old/checkout . --rounds 5

Each tree first fills its own cache (one cold process per step, not reported); then trees take
turns, round by round, one fresh process per step; the table shows medians. `dlvm_eq` is
imported before the clock starts (as in compile_time.py), so "warm" is `dq.jit(...)` to the
first result; its phases are the report's (pipeline/timing.py: import, trace, adjoint,
optimize, plan, kernels), which end before the step's first run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STEPS = ("mlp", "cnn", "transformer")

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, BENCH)
import numpy as np
import dlvm_eq as dq
import models
name = sys.argv[1]
model = models.MODELS.get(name)
if model is not None:
    params, (x, y) = model.params(), model.data()
    f = models.dlvm_step_functions(model)[1]
else:  # compile_time.py's MLP step: value_and_grad and SGD
    from dlvm_eq.models.mlp import init_params, loss
    rng = np.random.default_rng(0)
    x = rng.random((256, 784), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
    params = tuple(init_params([784, 256, 10]))
    vg = dq.value_and_grad(loss, argnums=(0, 1, 2, 3))
    def step(ps, x, y):
        value, grads = vg(*ps, x, y)
        return value, tuple(p - 0.01 * g for p, g in zip(ps, grads))
    f = dq.jit(step)
t, m = time.perf_counter(), time.thread_time()
f(params, x, y)
wall, main = time.perf_counter() - t, time.thread_time() - m
phases = getattr(f.report(params, x, y), "phases", {})
print(json.dumps({"wall": wall, "main": main, "phases": sum(phases.values()),
                  "imports": phases.get("import", 0.0), "modules": len(sys.modules),
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def child(tree: Path, step: str, cache: str) -> dict:
    from common import child_json

    return child_json(tree, CHILD.replace("BENCH", repr(str(HERE))), [step], cache)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", type=Path, default=[ROOT])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    trees = [t.resolve() for t in args.trees]
    rows: dict[tuple, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="dq-warm-") as tmp:
        caches = {(t, s): os.path.join(tmp, f"{i}-{s}") for i, t in enumerate(trees) for s in STEPS}
        for (tree, step), cache in caches.items():
            child(tree, step, cache)  # cold: fills the cache
        for r in range(args.rounds):
            for step in STEPS:
                for tree in trees if r % 2 == 0 else trees[::-1]:
                    rows.setdefault((step, tree), []).append(child(tree, step, caches[tree, step]))
            print(f"round {r} done", file=sys.stderr, flush=True)
    sys.path.insert(0, str(HERE))
    from common import machine_line

    cmd = " ".join(argv or sys.argv[1:])
    print(
        f"`benchmarks/warm_compile.py {cmd}`, {machine_line()}; medians of {args.rounds} rounds\n"
    )
    print(
        "| step | tree | warm wall s | main thread CPU s | compile phases ms (no step) "
        "| of which lazy imports ms | modules | peak RSS MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (step, tree), rs in rows.items():

        def m(k, rs=rs):
            return statistics.median(r[k] for r in rs)

        print(
            f"| {step} | `{tree}` | {m('wall'):.3f} | {m('main'):.3f} | {m('phases') * 1e3:.0f} "
            f"| {m('imports') * 1e3:.0f} | {m('modules'):.0f} | {m('rss'):.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
