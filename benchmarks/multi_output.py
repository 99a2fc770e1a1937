"""What multi-output fusion buys (issue 36): each benchmark model's value-and-gradient program,
optimized once, planned twice for the CPU, with reductions sharing a pass with the maps of their
space (codegen/planning/map_reduce.py) and without (DLVM_EQ_MULTI_OUTPUT=0), timed side by side.

    DLVM_EQ_NUM_THREADS=1 .venv/bin/python benchmarks/multi_output.py                     # the table
    DLVM_EQ_NUM_THREADS=1 .venv/bin/python benchmarks/multi_output.py --update BENCHMARKS.md

The models are egraph_models.MODELS (the 12 ordinary ones, the CNN, the transformer layer, ...).
Both programs are checked against the reference interpreter before anything is timed; the two
take turns round by round (egraph_value.time_pairs: the median over rounds of the ratio of
neighbouring rounds). The table gives the passes that hold a reduction and a map, and the fusion
stage's predicted saving (model seconds).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import reexec_without

UNSET = reexec_without()

import argparse  # noqa: E402
import datetime  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402

from common import machine_line, markdown_table, update_section  # noqa: E402
from egraph_models import MODELS, build  # noqa: E402
from egraph_value import check, time_pairs  # noqa: E402

SECTION = "## Multi-output fusion (reductions in one pass with their maps)"


def compiled_with(module, fname, multi: bool):
    import dlvm_eq as dq
    from dlvm_eq import config

    os.environ["DLVM_EQ_MULTI_OUTPUT"] = "1" if multi else "0"
    config.reload()
    return dq.compile(module, fname, target="cpu", optimize=False)


def run(rounds: int, steps: int, only=None):
    import dlvm_eq as dq
    from dlvm_eq.codegen.planning.plan import MapReduceStep

    built = []
    for model in MODELS:
        if only and model.__name__ not in only:
            continue
        title, algebraic, fname, args = build(model, algebra=True)
        module = dq.optimize(algebraic, fname, target="cpu").module
        off = compiled_with(module, fname, False)
        on = compiled_with(module, fname, True)
        if any(isinstance(s, MapReduceStep) for s in off.plan.steps):
            raise SystemExit(f"{title}: the program without multi-output fusion has a pass of it")
        check(title, module, fname, args, {"without": off, "with": on})
        passes = [s for s in on.plan.steps if isinstance(s, MapReduceStep)]
        fusion = on.plan.fusion
        built.append((title, off, on, args, passes, fusion.shared_saving if fusion else 0.0))
    timings = time_pairs([(off, on, args) for _, off, on, args, _, _ in built], rounds, steps)
    rows, speedups, fastest = [], [], []
    for (title, off, on, args, passes, saving), timing in zip(built, timings):
        (t_off, fast_off, _), (t_on, fast_on, _), speedup = timing
        speedups.append(speedup)
        fastest.append(fast_off / fast_on)
        reds = sum(len(p.reductions) for p in passes)
        rows.append(
            [
                title,
                f"{t_off * 1e3:.3f}",
                f"{t_on * 1e3:.3f}",
                f"{speedup:.2f}x",
                f"{fast_off / fast_on:.2f}x",
                f"{len(passes)} ({reds} reductions)",
                f"{saving * 1e6:.1f} us",
            ]
        )
    return rows, speedups, fastest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--only", nargs="+", choices=[m.__name__ for m in MODELS])
    ap.add_argument("--update", type=Path, help="write the section into this markdown file")
    args = ap.parse_args(argv)
    rows, speedups, fastest = run(args.rounds, args.steps, args.only)
    gmean = math.exp(sum(map(math.log, speedups)) / len(speedups))
    fast_gmean = math.exp(sum(map(math.log, fastest)) / len(fastest))
    table = markdown_table(
        [
            "model",
            "without ms",
            "with ms",
            "speedup (median of rounds)",
            "speedup (fastest calls)",
            "map + reduce passes",
            "predicted saving",
        ],
        rows,
    )
    load = os.getloadavg()[0]
    stamp = datetime.date.today().isoformat()
    text = (
        f"{SECTION}\n\n`DLVM_EQ_NUM_THREADS={os.environ.get('DLVM_EQ_NUM_THREADS', '')} "
        f".venv/bin/python benchmarks/multi_output.py --update BENCHMARKS.md` ({stamp}; "
        f"{machine_line()}; load average {load:.1f} at the end)\n\n{table}\n\n"
        f"Geometric mean {gmean:.2f}x over {len(rows)} models, slowest {min(speedups):.2f}x; "
        f"of the fastest calls {fast_gmean:.2f}x, slowest {min(fastest):.2f}x "
        f"(with / without: the same optimized program, planned with and without multi-output "
        f"fusion; {args.rounds} alternating rounds of {args.steps} calls).\n"
    )
    print(text)
    if args.update:
        update_section(args.update, SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
