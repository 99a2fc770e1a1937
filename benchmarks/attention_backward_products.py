"""The fused attention backward's block products, ours against OpenBLAS (issue 33): the whole
native backward (codegen/runtime/attention_backward.py's native_backward; batch 1, 4 heads,
head dim 64, no mask, the shipped tiles, one thread) with every product on OpenBLAS, each one
alone on our GEMM, all five on ours, and any extra choice named; the choices take turns call
by call, and each figure is the median of its calls' process CPU time.

    OPENBLAS_NUM_THREADS=1 DLVM_EQ_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python \\
        benchmarks/attention_backward_products.py --seq 1024 --rounds 15 --also s+dp+dq
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from dlvm_eq.codegen.cpu.attention_backward_ir import PRODUCTS
from dlvm_eq.codegen.runtime import attention_backward as ab
from dlvm_eq.codegen.runtime.attention_cpu import attention_forward
from dlvm_eq.ir.attention_op import KEY_BLOCK, QUERY_BLOCK


def choices(also: list[str]) -> dict[str, tuple[bool, ...]]:
    out = {"all OpenBLAS": (False,) * 5}
    out.update({p: tuple(p == x for x in PRODUCTS) for p in PRODUCTS})
    out["all ours"] = (True,) * 5
    for name in also:  # "s+dp": those products on ours
        wanted = set(name.split("+"))
        if not wanted <= set(PRODUCTS):
            raise SystemExit(f"--also {name}: products are {'+'.join(PRODUCTS)}")
        out[name] = tuple(p in wanted for p in PRODUCTS)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--also", nargs="*", default=[], help="more choices, e.g. s+dp+dq")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((1, 4, a.seq, 64)).astype(np.float32) for _ in range(4))
    o, lse = np.empty_like(q), np.empty((1, 4, a.seq), np.float32)
    attention_forward(q, k, v, 0.0, 0.125, False, o, threads=1, lse=lse)
    grads = [np.empty_like(q) for _ in range(3)]
    blocks = (QUERY_BLOCK, KEY_BLOCK)
    picks = choices(a.also)

    def run(ours) -> float:
        t = time.process_time()
        ab.native_backward(q, k, v, 0.0, 0.125, False, o, g, *grads, lse, 1, blocks, ours)
        return time.process_time() - t

    for ours in picks.values():  # compiles each task
        run(ours)
    times: dict[str, list[float]] = {name: [] for name in picks}
    for _ in range(a.rounds):
        for name, ours in picks.items():
            times[name].append(run(ours))
    base = statistics.median(times["all OpenBLAS"])
    print("| seq | products on our GEMM | median ms | of all OpenBLAS |\n|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {a.seq} | {name} | {med * 1e3:.2f} | {med / base:.3f}x |")


if __name__ == "__main__":
    main()
