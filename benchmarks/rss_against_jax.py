"""Peak RSS of a fresh process that jits the MLP's value-and-gradient (784-256-10 ReLU, batch
256, softmax cross-entropy) and runs it once: dlvm_eq cold (empty cache) and warm (the cache the
cold one filled), against JAX's jit in the same run, with each process's resident memory at the
end by mapping (/proc/self/smaps: LLVM's, egglog's, jaxlib's libraries against the heap).

    .venv/bin/python benchmarks/rss_against_jax.py                        # the table
    .venv/bin/python benchmarks/rss_against_jax.py --trees /old/checkout . --rounds 3

Each measurement is its own process (peak RSS from getrusage); trees and JAX take turns,
round by round; the table shows medians. benchmarks/compile_memory.py splits the cold
process's memory by stage and by Python package (tracemalloc).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CHILD = r"""
import json, os, resource, sys
from collections import Counter
import numpy as np
rng = np.random.default_rng(0)
w1 = (rng.standard_normal((784, 256)) * 0.05).astype(np.float32)
b1 = np.zeros(256, np.float32)
w2 = (rng.standard_normal((256, 10)) * 0.05).astype(np.float32)
b2 = np.zeros(10, np.float32)
x = rng.random((256, 784), dtype=np.float32)
y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
if sys.argv[1] == "dlvm_eq":
    import dlvm_eq as dq
    from dlvm_eq.models.mlp import loss
    value, grads = dq.jit(dq.value_and_grad(loss, argnums=(0, 1, 2, 3)))(w1, b1, w2, b2, x, y)
else:
    import jax, jax.numpy as jnp
    def loss(w1, b1, w2, b2, x, y):
        z = jax.nn.relu(x @ w1 + b1) @ w2 + b2
        return jnp.mean(-jnp.sum(jax.nn.log_softmax(z) * y, axis=1))
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(w1, b1, w2, b2, x, y)
    jax.block_until_ready(grads)
by, name = Counter(), None
for line in open("/proc/self/smaps"):
    parts = line.split()
    if ":" not in parts[0]:  # a mapping's header: address range, perms, ..., path
        name = os.path.basename(parts[5]) if len(parts) > 5 else "[anonymous]"
        name = name.split(".so")[0].split(".cpython")[0] if ".so" in name else name
        if name in ("[anonymous]", "[heap]"):
            name = "heap (anonymous)"
    elif parts[0] == "Rss:":
        by[name] += int(parts[1]) / 1024
print(json.dumps({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "value": float(value), "modules": len(sys.modules),
                  "mappings": by.most_common(6)}))
"""


def child(tree: Path, framework: str, cache: str) -> dict:
    from common import child_json

    return child_json(tree, CHILD, [framework], cache, {"JAX_PLATFORMS": "cpu"})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", type=Path, default=[ROOT])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    trees = [t.resolve() for t in args.trees]
    rows: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            with tempfile.TemporaryDirectory(prefix="dq-rss-") as cache:
                rows.setdefault(f"dlvm_eq cold, `{tree}`", []).append(child(tree, "dlvm_eq", cache))
                rows.setdefault(f"dlvm_eq warm, `{tree}`", []).append(child(tree, "dlvm_eq", cache))
        with tempfile.TemporaryDirectory(prefix="dq-rss-") as cache:
            rows.setdefault("JAX jit", []).append(child(ROOT, "jax", cache))
        print(f"round {r} done", file=sys.stderr, flush=True)
    sys.path.insert(0, str(HERE))
    from common import machine_line

    print(f"`benchmarks/rss_against_jax.py {' '.join(argv or sys.argv[1:])}`, {machine_line()}")
    print(f"medians of {args.rounds} rounds, each a fresh process\n")
    print("| process | peak RSS MB | modules | resident at the end by mapping (MB, last round) |")
    print("|---|---|---|---|")
    for label, rs in rows.items():
        maps = ", ".join(f"{n} {mb:.0f}" for n, mb in rs[-1]["mappings"])
        peak = statistics.median(r["peak"] for r in rs)
        mods = statistics.median(r["modules"] for r in rs)
        print(f"| {label} | {peak:.0f} | {mods:.0f} | {maps} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
