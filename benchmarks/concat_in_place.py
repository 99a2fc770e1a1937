"""x^T [dY1|dY2|dY3] against three products x^T dYi, the concatenation written in place
(codegen/planning/concat_in_place.py) and copied (its switch off): three programs compiled in
one process, checked equal, then called in turn round by round, CPU time per call.

    .venv/bin/python benchmarks/concat_in_place.py              # 200 rounds
    .venv/bin/python benchmarks/concat_in_place.py --rounds 50

The sizes are the transformer step's weight gradients (benchmarks/models.py: 2048 rows, d_model
256); each dYi is a cheap product (2048 x 8 @ 8 x 256) so that the products of interest
dominate. Run with OPENBLAS_NUM_THREADS=1 DLVM_EQ_NUM_THREADS=1 to compare one thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # this tree's dlvm_eq, not an installed one
sys.path[:0] = [str(ROOT)]

import numpy as np  # noqa: E402

import dlvm_eq as dq  # noqa: E402
from dlvm_eq.codegen.planning import concat_in_place  # noqa: E402
from dlvm_eq.pipeline import compile  # noqa: E402

N, C, K = 2048, 256, 8


def three(x, u1, u2, u3, w1, w2, w3):
    return x.T @ (u1 @ w1), x.T @ (u2 @ w2), x.T @ (u3 @ w3)


def merged(x, u1, u2, u3, w1, w2, w3):
    return x.T @ dq.concatenate([u1 @ w1, u2 @ w2, u3 @ w3], axis=1)


def _compiled(fn, args):
    m = dq.make_ir(fn)(*args)
    return compile(m, next(iter(m.functions)), optimize=False)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((N, C)).astype(np.float32)]
    args += [rng.standard_normal((N, K)).astype(np.float32) for _ in range(3)]
    args += [rng.standard_normal((K, C)).astype(np.float32) for _ in range(3)]
    progs = {"three products": _compiled(three, args), "merged, in place": _compiled(merged, args)}
    concat_in_place.ENABLED = False  # part of the plan cache's key: planned again
    progs["merged, copied"] = _compiled(merged, args)
    concat_in_place.ENABLED = True
    want = np.concatenate(progs["three products"](*args), axis=1)
    for name in ("merged, in place", "merged, copied"):
        np.testing.assert_allclose(progs[name](*args), want, rtol=1e-4, atol=1e-2)
    seconds: dict[str, list[float]] = {k: [] for k in progs}
    for _ in range(a.rounds):
        for name, prog in progs.items():
            t = time.process_time()
            out = prog(*args)
            seconds[name].append(time.process_time() - t)
            del out
    print(f"load {Path('/proc/loadavg').read_text().split()[:3]}")
    for name, ts in seconds.items():
        print(
            f"{name:18s} CPU median {1e3 * statistics.median(ts):.3f} ms, min {1e3 * min(ts):.3f}"
        )


if __name__ == "__main__":
    main()
