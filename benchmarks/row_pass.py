"""What a row pass with recomputed per-row values buys (issue 36, multi-output fusion): a
post-norm layer norm's value and gradient (residual sum, gain, bias, mean squared error), planned
twice in one process, with the row kernels recomputing the per-row values other kernels read
(planning/rowfusion.py, planning/map_reduce.copies_per_row_maps) and without, timed in turns.

    OPENBLAS_NUM_THREADS=1 DLVM_EQ_NUM_THREADS=1 .venv/bin/python benchmarks/row_pass.py
    ... benchmarks/row_pass.py --shapes 16x128x256 64x128x64 --rounds 15 --all-rows

Both plans are run once and compared (the same arithmetic; a row kernel may sum in another
order than a reduction kernel, so bits may differ where LLVM vectorizes the two differently). Per shape it prints the kernels of each plan, the CPU ms per call of each
(median over rounds of 20 calls) and the median ratio of neighbouring rounds. --all-rows lifts
the ROW_PASS_MIN_COLS threshold, to measure the short rows it keeps out.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import reexec_without

UNSET = reexec_without()

import argparse  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from common import machine_line  # noqa: E402


def layer_norm_grad(shape):
    import dlvm_eq as dq

    rng = np.random.default_rng(0)
    a, c, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    g, b = np.ones(shape[-1], np.float32), np.zeros(shape[-1], np.float32)

    def loss(g, b, a, c, y):
        h = a + c
        mu = dq.mean(h, axis=-1, keepdims=True)
        var = dq.mean((h - mu) * (h - mu), axis=-1, keepdims=True)
        out = (h - mu) / dq.sqrt(var + 1e-5) * g + b
        return dq.mean((out - y) * (out - y))

    args = (g, b, a, c, y)
    module = dq.make_ir(dq.value_and_grad(loss, argnums=(0, 1, 2, 3)))(*args)
    return module, next(iter(module.functions)), args


def compiled_pair(module, name):
    """(with copies, without): each planned with a fresh kernel cache."""
    from dlvm_eq.codegen import set_cache_dir
    from dlvm_eq.codegen.planning.map_reduce import MapReduceFusion
    from dlvm_eq.pipeline import compile

    out = []
    keep = MapReduceFusion.copies_per_row_maps
    for copies in (True, False):
        set_cache_dir(tempfile.mkdtemp(prefix="dlvm-eq-row-pass-"))
        if not copies:
            MapReduceFusion.copies_per_row_maps = lambda self, *a: False
        try:
            out.append(compile(module, name, optimize=False))
        finally:
            MapReduceFusion.copies_per_row_maps = keep
    return out


def measure(shape, rounds: int, calls: int = 20) -> str:
    module, name, args = layer_norm_grad(shape)
    fs = compiled_pair(module, name)
    first = [f(*args) for f in fs]
    diff = max(
        float(np.max(np.abs(np.asarray(p) - q), initial=0.0)) / max(1e-30, float(np.max(np.abs(q))))
        for p, q in zip(*first)
    )
    ts: list[list[float]] = [[], []]
    for r in range(rounds):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            t0 = time.process_time()
            for _ in range(calls):
                fs[i](*args)
            ts[i].append((time.process_time() - t0) / calls * 1e3)
    ratio = statistics.median(b / a for a, b in zip(*ts))
    kernels = [len(f.report.plan.kernels) for f in fs]
    return (
        f"{'x'.join(map(str, shape))}: kernels {kernels[1]} -> {kernels[0]}, CPU ms per call "
        f"{statistics.median(ts[1]):.3f} -> {statistics.median(ts[0]):.3f} "
        f"({ratio:.2f}x), largest difference {diff:.1e} of the largest value, load {os.getloadavg()[0]:.1f}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["16x128x256", "64x128x64", "256x128x32"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--all-rows", action="store_true", help="no ROW_PASS_MIN_COLS threshold")
    a = ap.parse_args(argv)
    if a.all_rows:
        from dlvm_eq.codegen.planning import map_reduce

        map_reduce.ROW_PASS_MIN_COLS = 0
    print(machine_line())
    for s in a.shapes:
        print(measure(tuple(int(d) for d in s.split("x")), a.rounds), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
