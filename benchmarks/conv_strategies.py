"""Convolution strategies on the CNN demo's shapes, side by side in one run (medians and minima
in ms, the variants taking turns): numpy's im2col + BLAS (ir/window_ops.py, the reference
algorithm), the generated im2col/col2im kernels with one product per group and chunk of
images for several chunk sizes, one product per image, and the rule runtime/conv_cpu.py
picks.

    .venv/bin/python benchmarks/conv_strategies.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import reexec_without

reexec_without()

import numpy as np  # noqa: E402

from dlvm_eq.codegen.planning.window import _cpu_matmul  # noqa: E402
from dlvm_eq.codegen.runtime import conv_cpu  # noqa: E402
from dlvm_eq.ir import window_ops  # noqa: E402

PAD1 = dict(stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)
# (op, x or dY shape, weight shape): the CNN step's five convolutions
CASES = [
    ("conv2d", (128, 1, 28, 28), (32, 1, 3, 3)),
    ("conv2d", (128, 32, 14, 14), (64, 32, 3, 3)),
    ("conv2dBackwardInput", (128, 64, 14, 14), (64, 32, 3, 3)),
    ("conv2dBackwardWeight", (128, 1, 28, 28), (32, 1, 3, 3)),
    ("conv2dBackwardWeight", (128, 32, 14, 14), (64, 32, 3, 3)),
]
# name: (chunk bytes, one product per image)
STRATEGIES = {
    "one product, 4 MB chunks": (4 << 20, False),
    "one product, 16 MB chunks": (16 << 20, False),
    "one product, whole batch": (1 << 40, False),
    "one product per image": (None, True),
}


def _args(op, a_shape, w_shape, rng):
    a = rng.standard_normal(a_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    if op == "conv2d":
        return [a, w], PAD1
    if op == "conv2dBackwardInput":
        return [a, w], dict(PAD1, size=a_shape[2:])
    dy = rng.standard_normal((a_shape[0], w_shape[0]) + a_shape[2:]).astype(np.float32)
    return [a, dy], dict(PAD1, size=w_shape[2:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    opts = ap.parse_args()
    rng = np.random.default_rng(0)
    matmul = _cpu_matmul()
    print("| op | input | strategy | median ms | min ms |\n|---|---|---|---|---|")
    for op, a_shape, w_shape in CASES:
        args, attrs = _args(op, a_shape, w_shape, rng)
        want = window_ops.evaluate(op, np, args, attrs, matmul)
        variants = {"numpy im2col + BLAS": lambda: window_ops.evaluate(op, np, args, attrs, matmul)}
        for name, (nbytes, small) in STRATEGIES.items():
            variants[name] = lambda nbytes=nbytes, small=small: conv_cpu.evaluate(
                op, args, attrs, matmul, chunk_bytes=nbytes, small=small
            )
        variants["the rule (runtime/conv_cpu.py)"] = lambda: conv_cpu.evaluate(
            op, args, attrs, matmul
        )
        times = {k: [] for k in variants}
        for name, f in variants.items():  # checked before anything is timed
            np.testing.assert_allclose(f(), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
        for _ in range(opts.rounds):
            for name, f in variants.items():
                for _ in range(opts.repeats):
                    t0 = time.perf_counter()
                    f()
                    times[name].append(time.perf_counter() - t0)
        for name, ts in times.items():
            print(
                f"| {op} | {a_shape} x {w_shape} | {name} | {np.median(ts) * 1e3:.1f} | {min(ts) * 1e3:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
