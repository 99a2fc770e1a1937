"""Where a compiling process's memory goes: a fresh process jits the MLP's value-and-gradient
step (benchmarks/compile_time.py's "MLP step") with an empty cache and runs it once.

    .venv/bin/python benchmarks/compile_memory.py            # the tables (a fresh child process)
    .venv/bin/python benchmarks/compile_memory.py --update BENCHMARKS.md

Two views, both from the child:
- resident memory (VmRSS, /proc/self/status) after each stage, with the process's peak
  (VmHWM), and at the end each mapping's resident share (/proc/self/smaps): the shared
  libraries (egglog's, LLVM's, OpenBLAS's) against the anonymous heap;
- tracemalloc's peak and its largest holders by package at the end of the compile: the
  Python objects (IR, e-graph JSON, plans). Native allocations (egglog's e-graph in Rust,
  LLVM's modules in C++) are invisible to tracemalloc, so they show only in the heap's RSS.
tracemalloc slows the compile (every allocation is traced): its times are not compile times.
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
ROOT = HERE.parent
SECTION = "## Compile memory (where the MLP step's peak RSS goes)"

CHILD = r"""
import json, re, sys, tracemalloc
from collections import Counter

def status():
    text = open("/proc/self/status").read()
    field = lambda name: int(re.search(name + r":\s+(\d+)", text).group(1)) / 1024
    return round(field("VmRSS"), 1), round(field("VmHWM"), 1)

def mappings():
    # resident MB per mapped file (shared libraries), anonymous memory together as "heap"
    out, name = Counter(), None
    for line in open("/proc/self/smaps"):
        parts = line.split()
        if ":" not in parts[0]:  # a mapping's header: address range, perms, ..., path
            name = parts[5] if len(parts) > 5 else "[anonymous]"
            if name.startswith("/"):
                name = name.rsplit("/", 1)[-1]
            if name in ("[anonymous]", "[heap]"):
                name = "heap (anonymous)"
        elif parts[0] == "Rss:":
            out[name] += int(parts[1]) / 1024
    return out

stages = [("python", *status())]
import numpy as np
stages.append(("numpy", *status()))
tracemalloc.start()
import dlvm_eq as dq
stages.append(("import dlvm_eq", *status()))
from dlvm_eq.models.mlp import init_params, loss
import dlvm_eq.pipeline.native
stages.append(("code generator loaded (llvmlite, planner)", *status()))
from dlvm_eq.egraph.optimize import prepare_session
prepare_session()
stages.append(("shipped rules compiled (egglog session)", *status()))
rng = np.random.default_rng(0)
params = init_params([784, 256, 10])
x = rng.random((256, 784), dtype=np.float32)
y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
vg = dq.value_and_grad(loss, argnums=(0, 1, 2, 3))
def step(w1, b1, w2, b2, x, y):
    value, grads = vg(w1, b1, w2, b2, x, y)
    return value, tuple(p - 0.01 * g for p, g in zip((w1, b1, w2, b2), grads))
f = dq.jit(step)
out = f(*params, x, y)
stages.append(("jit(value_and_grad) compiled and run once", *status()))
current, peak = tracemalloc.get_traced_memory()
snapshot = tracemalloc.take_snapshot()
by_package = Counter()
for stat in snapshot.statistics("filename"):
    path = stat.traceback[0].filename
    parts = path.replace("\\", "/").split("/")
    if "dlvm_eq" in parts:
        i = parts.index("dlvm_eq")
        key = "/".join(parts[i : i + 2]) if i + 2 < len(parts) else parts[i]
    elif path.startswith("<frozen importlib"):
        key = "imported modules (code objects, classes)"
    elif "site-packages" in parts:
        key = parts[parts.index("site-packages") + 1]
    else:
        key = "python stdlib and others"
    by_package[key] += stat.size / 2**20
print(json.dumps({
    "stages": stages,
    "traced_mb": [round(current / 2**20, 1), round(peak / 2**20, 1)],
    "by_package": by_package.most_common(10),
    "mappings": mappings().most_common(8),
}))
"""


def measure(tree: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="dq-memory-") as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPATH=str(tree), DLVM_EQ_CACHE_DIR=cache)
        run = subprocess.run(
            [sys.executable, "-c", CHILD],
            env=env,
            cwd=tempfile.gettempdir(),
            capture_output=True,
            text=True,
            timeout=600,
        )
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-2000:])
    return json.loads(run.stdout.strip().splitlines()[-1])


def report(m: dict) -> str:
    lines = ["| after | RSS MB | peak RSS MB |", "|---|---|---|"]
    lines += [f"| {name} | {rss:.0f} | {hwm:.0f} |" for name, rss, hwm in m["stages"]]
    current, peak = m["traced_mb"]
    out = ["\n".join(lines)]
    out.append(
        "Resident at the end, by mapping (MB):\n\n| mapping | RSS MB |\n|---|---|\n"
        + "\n".join(f"| {name} | {mb:.0f} |" for name, mb in m["mappings"])
    )
    out.append(
        f"tracemalloc (Python objects only): {current:.0f} MB held at the end, {peak:.0f} MB at "
        "the peak; held at the end, by package (MB):\n\n| package | MB |\n|---|---|\n"
        + "\n".join(f"| {name} | {mb:.1f} |" for name, mb in m["by_package"])
    )
    return "\n\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="the source tree to import")
    ap.add_argument("--update", type=Path, help="write the section into this markdown file")
    args = ap.parse_args(argv)
    text = report(measure(args.tree.resolve()))
    sys.path.insert(0, str(HERE))
    from common import machine_line

    cmd = "benchmarks/compile_memory.py " + " ".join(argv if argv is not None else sys.argv[1:])
    section = f"{SECTION}\n\n`{cmd.strip()}`, {machine_line()}.\n\n{text}"
    print(section)
    if args.update:
        from common import update_section

        update_section(args.update, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
