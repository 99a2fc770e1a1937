"""Products written in their reader's layout (codegen/planning/product_layout.py), on and off:
the transformer step of benchmarks/models.py compiled twice in one process, the two taking
turns round by round (alternating which goes first), checked equal before anything is timed.

    .venv/bin/python benchmarks/head_layout.py                          # prints the table
    .venv/bin/python benchmarks/head_layout.py --gemm ours              # batched products by our GEMM
    .venv/bin/python benchmarks/head_layout.py --update BENCHMARKS.md   # and writes its section

Off, attention's head merge and the merges of dQ, dK and dV are copy kernels after their
batched products; on, the products write those layouts themselves. The speedup is the median
over rounds of off's step time over on's in the same round.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # this tree's dlvm_eq, not an installed one
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
from common import reexec_without  # noqa: E402

UNSET = reexec_without()

import argparse  # noqa: E402
import datetime  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from common import machine_line, update_section  # noqa: E402

SECTION = "## Products written in their reader's layout (transformer step)"


def build(model, enabled: bool):
    from models import dlvm_step_functions

    from dlvm_eq.codegen.planning import product_layout

    product_layout.ENABLED = enabled  # read when planning: the first call below
    _, step = dlvm_step_functions(model)
    p, (x, y) = model.params(), model.data()
    step(p, x, y)
    product_layout.ENABLED = True
    report = step.report(p, x, y)
    copies = sum(1 for k in report.plan.kernels if k.name.endswith("_copy"))
    return step, p, x, y, copies, report.predicted.seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--gemm", choices=["default", "ours"], default="default")
    ap.add_argument("--update", type=Path)
    args = ap.parse_args(argv)
    if args.gemm == "ours":
        os.environ["DLVM_EQ_GEMM"] = "1"  # read once, at the first product: none ran yet
    import models

    model = models.MODELS["transformer"]
    variants = {name: build(model, on) for name, on in (("off", False), ("on", True))}
    outs = {k: v[0](*v[1:4])[0] for k, v in variants.items()}
    if not np.isclose(outs["off"], outs["on"], rtol=1e-5):
        raise AssertionError(f"the two programs disagree: {outs}")
    times: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(args.rounds):
        for name in ("off", "on") if r % 2 == 0 else ("on", "off"):
            step, p, x, y = variants[name][:4]
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(p, x, y)
            times[name].append((time.perf_counter() - t0) / args.steps)
    ratio = statistics.median(a / b for a, b in zip(times["off"], times["on"]))
    load = os.getloadavg()
    rows = [
        f"| {name} | {statistics.median(times[name]) * 1e3:.2f} ms | {variants[name][4]} "
        f"| {variants[name][5] * 1e3:.2f} ms |"
        for name in ("off", "on")
    ]
    text = "\n".join(
        [
            SECTION,
            "",
            f"`python benchmarks/head_layout.py --gemm {args.gemm}` ({datetime.date.today()}; "
            f"{machine_line()}; load average {load[0]:.1f} at the end; {args.rounds} rounds of "
            f"{args.steps} steps; batched products by "
            f"{'our GEMM' if args.gemm == 'ours' else 'the shipped default'}).",
            "",
            "| layout writes | step (median) | copy kernels | predicted |",
            "|---|---|---|---|",
            *rows,
            "",
            f"Speedup on / off (median of paired rounds): {ratio:.3f}x.",
        ]
    )
    print(text)
    if args.update:
        update_section(args.update, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
