"""The convolutions and our GEMM alone, shipped blocks against calibrated ones (issue 36).

    OPENBLAS_NUM_THREADS=1 DLVM_EQ_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/conv_gemm_blocks.py

The calibrated blocks are what `dlvm-eq calibrate` would store (calibration/measure.py's
conv_blocks and gemm_blocks, run here first), or --conv/--gemm given as JSON. Each round times
both blockings in turn (alternating), each after one untimed call (switching blocks changes
the scratch matrices' sizes, whose fresh pages a program that keeps its blocks never pays
again), as the CPU time of the calling thread (the fastest of 3 calls): with one thread all
the work runs there. Printed: per case the medians over rounds and the median of the paired
ratios calibrated / shipped, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from dlvm_eq.calibration import measure
from dlvm_eq.codegen.runtime import conv_blocks, conv_cpu
from dlvm_eq.codegen.runtime.gemm_runtime import HOST_WIDE, CpuGemm
from dlvm_eq.codegen.runtime.gemm_tiles import with_blocks

# benchmarks/models.py's CNN: its two layers (batch 128, pad 1)
CNN_LAYERS = (((128, 1, 28, 28), (32, 1, 3, 3)), ((128, 32, 14, 14), (64, 32, 3, 3)))
PRODUCTS = ((512, 512, 512), (2048, 256, 256), (1024, 1024, 1024), (128, 784, 256))


def _cpu_seconds(fn, calls: int = 3) -> float:
    fn()  # untimed: scratch of this blocking's sizes
    best = float("inf")
    for _ in range(calls):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best


def _matmul(a, b, out):
    np.matmul(a, b, out=out)


def conv_cases():
    rng = np.random.default_rng(0)
    for xs, ws in CNN_LAYERS:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        attrs = dict(stride=(1, 1), padding=(1,) * 4, dilation=(1, 1), groups=1)
        dy = conv_cpu.evaluate("conv2d", (x, w), attrs, _matmul)
        for op, args, a in (
            ("conv2d", (x, w), attrs),
            ("conv2dBackwardInput", (dy, w), {**attrs, "size": xs[2:]}),
            ("conv2dBackwardWeight", (x, dy), {**attrs, "size": ws[2:]}),
        ):
            yield (
                f"{op} {xs} {ws}",
                (lambda op=op, args=args, a=a: conv_cpu.evaluate(op, args, a, _matmul)),
            )


def run(rounds: int, conv: dict, gemm: dict) -> None:
    print(f"load {_load()}")
    print(f"shipped conv {conv_blocks.SHIPPED}, calibrated {conv}")
    for name, fn in conv_cases():
        times: dict = {"shipped": [], "calibrated": []}
        for _ in range(rounds):
            for label, blocks in (("shipped", None), ("calibrated", conv)):
                conv_blocks.use_blocks(blocks)
                times[label].append(_cpu_seconds(fn))
        conv_blocks.use_blocks(None)
        _line(name, times)
    print(f"shipped GEMM {HOST_WIDE}, calibrated {gemm}")
    gemms = {
        "shipped": CpuGemm(tile=dict(HOST_WIDE), threads=1),
        "calibrated": CpuGemm(tile=with_blocks(HOST_WIDE, gemm), threads=1),
    }
    rng = np.random.default_rng(1)
    for m, k, n in PRODUCTS:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        o = np.empty((m, n), np.float32)
        times = {"shipped": [], "calibrated": []}
        for _ in range(rounds):
            for label, g in gemms.items():
                times[label].append(_cpu_seconds(lambda g=g: g(a, b, o)))
        _line(f"GEMM {m}x{k}x{n}", times)
    print(f"load {_load()}")


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _line(name: str, times: dict) -> None:
    s, c = (statistics.median(times[k]) * 1e3 for k in ("shipped", "calibrated"))
    ratio = statistics.median(b / a for a, b in zip(times["shipped"], times["calibrated"]))
    print(f"  {name:<58} shipped {s:8.2f} ms  calibrated {c:8.2f} ms  ratio {ratio:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--conv", type=json.loads, help='e.g. {"chunk_bytes": 16777216, ...}')
    ap.add_argument("--gemm", type=json.loads, help='e.g. {"kc": 384, "mc": 144}')
    args = ap.parse_args()
    t0 = time.perf_counter()
    conv = args.conv or measure.conv_blocks()
    t1 = time.perf_counter()
    gemm = args.gemm or measure.gemm_blocks()
    t2 = time.perf_counter()
    print(f"calibration: conv blocks {t1 - t0:.1f} s, GEMM blocks {t2 - t1:.1f} s")
    run(args.rounds, conv, gemm)


if __name__ == "__main__":
    main()
