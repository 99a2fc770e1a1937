"""Whole warm processes of the MLP's value-and-grad (the disk cache filled): the child's CPU
time (Python's start, `import dlvm_eq`, the jit and the first call), `import dlvm_eq`'s wall
time and `dq.jit(...)` to the first result, trees alternating round by round, one OpenBLAS
thread; the table shows medians (the first round, which fills each tree's cache, is left out).

    .venv/bin/python benchmarks/warm_process.py --trees /old/checkout . --rounds 15
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import time
t0 = time.perf_counter()
import numpy as np
import dlvm_eq as dq
t1 = time.perf_counter()
from dlvm_eq.models.mlp import init_params, loss
rng = np.random.default_rng(0)
x = rng.random((256, 784), dtype=np.float32)
y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
params = tuple(init_params([784, 256, 10]))
vg = dq.value_and_grad(loss, argnums=(0, 1, 2, 3))
f = dq.jit(lambda ps, x, y: vg(*ps, x, y))
t2 = time.perf_counter()
f(params, x, y)
print(t1 - t0, time.perf_counter() - t2)
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", type=Path, default=[Path(__file__).parent.parent])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    trees = [t.resolve() for t in args.trees]
    rows: dict[Path, list[tuple[float, float, float]]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory(prefix="dq-warm-process-") as tmp:
        for r in range(args.rounds):
            for tree in trees if r % 2 == 0 else trees[::-1]:
                env = dict(
                    os.environ,
                    PYTHONPATH=str(tree),
                    DLVM_EQ_CACHE_DIR=os.path.join(tmp, str(trees.index(tree))),
                    OPENBLAS_NUM_THREADS="1",
                    # bytecode cached outside the trees, as after an install (the first round
                    # writes it): without it every process compiles every module it imports
                    PYTHONPYCACHEPREFIX=os.path.join(tmp, "pyc"),
                )
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                run = subprocess.run(
                    [sys.executable, "-c", CHILD],
                    env=env,
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                if run.returncode != 0:
                    raise RuntimeError(f"{tree}: {run.stderr[-1500:]}")
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                imported, first = (float(w) for w in run.stdout.split()[-2:])
                if r > 0:
                    rows[tree].append((cpu, imported, first))
    sys.path.insert(0, str(Path(__file__).parent))
    from common import machine_line

    print(f"`benchmarks/warm_process.py {' '.join(argv or sys.argv[1:])}`, {machine_line()}\n")
    print("| tree | process CPU ms | `import dlvm_eq` ms | `dq.jit` to first result ms |")
    print("|---|---|---|---|")
    for tree, rs in rows.items():
        cpu, imported, first = (statistics.median(x[k] for x in rs) * 1e3 for k in range(3))
        print(f"| `{tree}` | {cpu:.0f} | {imported:.0f} | {first:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
