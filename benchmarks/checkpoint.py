"""dq.checkpoint in a scan body: what the forward scan stores for the backward scan, the peak
bytes one compiled gradient call allocates, and its time, with and without the checkpoint.
The step is two layers deep (tanh(sin(tanh(h W1 + x) W2) * h)), so its residuals are several
carries; checkpointed, the forward stores the carry alone and the backward step runs the
layers again. Batch 16, hidden 64, float32, target cpu; timings alternate the two programs
round by round (one thread at a time on a shared machine).

    python benchmarks/checkpoint.py
    python benchmarks/checkpoint.py --update BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, markdown_table, update_section

BATCH, HIDDEN = 16, 64
HEADING = "## dq.checkpoint in a scan body (issue 30)"


def _loss(remat: bool):
    import dlvm_eq as dq

    def loss(w1, w2, h0, xs):
        def layers(h, x):
            return dq.tanh(dq.sin(dq.tanh(h @ w1 + x) @ w2) * h)

        f = dq.checkpoint(layers) if remat else layers
        h, _ = dq.scan(lambda h, x: (f(h, x), None), h0, xs)
        return dq.mean(h * h)

    return loss


def stored_bytes(module) -> int:
    """Bytes the forward scans stack for the reverse (adjoint) scans, read off the IR."""
    import numpy as np

    fn = next(iter(module.functions.values()))
    scans = {id(i.result) for i in fn.body if i.op == "scan"}
    from_scan = {id(i.result) for i in fn.body if i.op == "extract" and id(i.operands[0]) in scans}
    total = 0
    for i in fn.body:
        if i.op == "scan" and i.attrs["body"].name.endswith(".adjoint"):
            nc, nx = i.attrs["carries"], i.attrs["xs"]
            for o in i.operands[nc : nc + nx]:
                if id(o) in from_scan:
                    total += int(np.prod(o.type.shape)) * o.type.dtype.numpy.itemsize
    return total


def run(steps_list=(64, 256), rounds: int = 7) -> list[list]:
    import numpy as np

    import dlvm_eq as dq

    rows = []
    for steps in steps_list:
        rng = np.random.default_rng(0)
        w1, w2 = ((rng.standard_normal((HIDDEN, HIDDEN)) * 0.1).astype(np.float32) for _ in "ab")
        h0 = np.zeros((BATCH, HIDDEN), np.float32)
        xs = rng.standard_normal((steps, BATCH, HIDDEN)).astype(np.float32)
        args = (w1, w2, h0, xs)
        grads = {k: dq.jit(dq.grad(_loss(k), argnums=(0, 1))) for k in (False, True)}
        out = {}
        for remat, g in grads.items():
            g(*args)
            g(*args)  # buffers the executor keeps between calls are not counted
            tracemalloc.start()
            g(*args)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            ir = dq.make_ir(dq.grad(_loss(remat), argnums=(0, 1)))(*args)
            out[remat] = {"stored": stored_bytes(ir), "peak": peak, "times": []}
        np.testing.assert_allclose(grads[True](*args)[0], grads[False](*args)[0], rtol=1e-4)
        for _ in range(rounds):  # alternating: the same load for both
            for remat, g in grads.items():
                t0 = time.perf_counter()
                g(*args)
                out[remat]["times"].append(time.perf_counter() - t0)
        for remat in (False, True):
            o = out[remat]
            rows.append(
                [
                    steps,
                    "checkpoint" if remat else "none",
                    f"{o['stored'] / 1024:.0f}",
                    f"{o['peak'] / 1024:.0f}",
                    f"{np.median(o['times']) * 1e3:.1f}",
                ]
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--update", type=Path, help="write the section into this markdown file")
    a = ap.parse_args()
    load = os.getloadavg()[0]
    rows = run(a.steps, a.rounds)
    table = markdown_table(
        ["T", "program", "stored residuals KiB", "peak KiB", "grad call ms (median)"], rows
    )
    text = (
        f"{HEADING}\n\nCommand: `python benchmarks/checkpoint.py --update BENCHMARKS.md`  \n"
        f"Machine: {machine_line()}; load average {load:.2f} before the run (a shared machine).\n\n"
        f"{__doc__.split(chr(10) + chr(10))[0]}\n\n{table}\n\n"
        "Stored residuals: the stacks the forward scan hands the backward scan (read off the "
        "gradient's IR); peak: bytes allocated during one compiled gradient call (tracemalloc, "
        "numpy's arrays included, after two warm-up calls).\n"
    )
    print(text)
    if a.update:
        update_section(a.update, HEADING, text)


if __name__ == "__main__":
    main()
