"""What the e-graph buys on real training steps: each model's value-and-gradient program compiled
twice for the CPU, with the algebra off (`dq.compile(..., optimize=False)`) and on, by the same
code generator with the same fusion, side by side in one run.

    .venv/bin/python benchmarks/egraph_value.py                          # prints the table
    .venv/bin/python benchmarks/egraph_value.py --update BENCHMARKS.md   # and writes its section

For each model: the measured speedup (the two taking turns round by round, in alternating order,
each model's rounds spread over the whole run: the median over rounds of off's step time over
on's in the round next to it, a round's first call aside: `time_pairs`), the predicted speedup (the
planned programs' predicted times, off / on: `calibration.plan_cost.predict_plan`, every step
of the plan that runs priced from the machine), the rules that fired most, the e-graph's size and the optimizer's time. Both programs are checked
against the reference interpreter before anything is timed. Under the table: the Spearman rank
correlation between predicted and measured program times over all the programs, and how far
each prediction is from its measurement (the calibration target: rho >= 0.9, within 1.5x).
Run `dlvm-eq calibrate` first to price with this machine's measured profile; the table says
which cost model priced it. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed (the script
restarts itself without them), as in the other benchmarks.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import reexec_without

UNSET = reexec_without()

import os  # noqa: E402

# The optimizer's time in the table is its work, not a lookup: without this a second run in the
# same cache directory read the optimized functions from disk (0.03 s where they took 0.1-0.6).
os.environ["DLVM_EQ_NO_IR_CACHE"] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from common import machine_line, markdown_table, update_section  # noqa: E402
from egraph_models import CONTRIVED, MODELS, build  # noqa: E402

SECTION = "## What the e-graph buys (algebra off vs on)"


# ---------------------------------------------------------------- measuring


def flat(out):
    if isinstance(out, (tuple, list)):
        return [a for o in out for a in flat(o)]
    return [np.asarray(out, np.float64)]


def check(name, module, fname, args, compiled):
    import dlvm_eq as dq

    want = flat(dq.interpret(module, fname, *args))
    for label, f in compiled.items():
        got = flat(f(*args))
        for w, g in zip(want, got):
            scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
            if not np.allclose(g, w, rtol=2e-3, atol=2e-3 * scale):
                raise SystemExit(
                    f"{name}: the {label} program disagrees with the interpreter "
                    f"(max error {np.max(np.abs(g - w)):.3g})"
                )


def time_pairs(pairs, rounds: int, steps: int):
    """For each (off, on, args): ((median, fastest, first) seconds per call of off, the same of
    on, the measured speedup). Off and on take turns round by round, `steps` calls a round:
    - median: the median over rounds of a round's mean call after its first, i.e. back-to-back
      calls, as a training loop makes them and as the cost model prices them (each step's data
      in cache, its workers awake);
    - fastest: the fastest single call (what a quiet machine gives; on a loaded one rounds get
      interrupted and the medians grow);
    - first: the median over rounds of a round's first call, which follows the other models'
      rounds: the caches hold their data and the pool's workers sleep (the logistic loss: 96 us
      against 29 for the calls after it);
    - speedup: the median over rounds of off's round (after its first call) over on's round
      next to it (this machine slows by 1.5x for seconds at a time: a ratio of two medians can
      set a slow stretch of one against a quick one of the other; a round and the next share
      one).
    The order alternates (off then on, on then off), so that a drift within a pair of rounds
    favours neither. Round r of every model runs before round r + 1 of any: each model's rounds
    are spread over the whole run, so that no model is measured only inside one slow stretch of
    this VM (a fixed 128x64x128 product's fastest of 20 calls moves between 30 and 63 us from
    one second to the next here)."""
    if steps < 2:
        raise SystemExit("--steps must be at least 2 (a round's first call is reported apart)")
    rounds_of = [{"off": [], "on": []} for _ in pairs]
    firsts = [{"off": [], "on": []} for _ in pairs]
    fastest = [{"off": math.inf, "on": math.inf} for _ in pairs]
    for off, on, args in pairs:
        for f in (off, on):
            for _ in range(3):
                f(*args)
    for i in range(rounds):
        for j, (off, on, args) in enumerate(pairs):
            pair = (("off", off), ("on", on))
            for label, f in pair if i % 2 == 0 else pair[::-1]:
                calls = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    f(*args)
                    calls.append(time.perf_counter() - t0)
                fastest[j][label] = min(fastest[j][label], *calls)
                firsts[j][label].append(calls[0])
                rounds_of[j][label].append(sum(calls[1:]) / (steps - 1))
    out = []
    for r, first, fast in zip(rounds_of, firsts, fastest):
        speedup = statistics.median(a / b for a, b in zip(r["off"], r["on"]))
        out.append(
            (
                *(
                    (statistics.median(r[k]), fast[k], statistics.median(first[k]))
                    for k in ("off", "on")
                ),
                speedup,
            )
        )
    return out


def spearman(xs, ys) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for pos, i in enumerate(order):
            r[i] = pos
        return r

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else float("nan")


def predicted_seconds(compiled) -> float:
    """The predicted time of the plan a compiled function runs."""
    from dlvm_eq.calibration.plan_cost import predict_plan

    return predict_plan(compiled.plan, "cpu").seconds


def stable(result, fname) -> tuple[str, ...]:
    """The numerically stable rewrites that fired (the guard keeps those whatever the gain)."""
    from dlvm_eq.egraph.stability import stable_rules_fired

    sat = result.report[fname].saturation
    return tuple(stable_rules_fired(sat.rule_matches)) if sat else ()


def run(rounds: int, steps: int, only=None):
    import dlvm_eq as dq
    from dlvm_eq.extract.machine import machine
    from dlvm_eq.pipeline.never_slower import choose_program

    built = []
    for model in MODELS:
        if only and model.__name__ not in only:
            continue
        title, plain, fname, args = build(model, algebra=False)
        _, algebraic, _, _ = build(model, algebra=True)
        off = dq.compile(plain, fname, target="cpu", optimize=False)
        t0 = time.perf_counter()
        result = dq.optimize(algebraic, fname, target="cpu")
        on = dq.compile(result.module, fname, target="cpu", optimize=False)
        optimize_s = time.perf_counter() - t0
        check(title, plain, fname, args, {"unoptimized": off, "optimized": on})
        built.append((title, fname, off, on, args, result, optimize_s))
    rows, programs, records = [], [], []
    timings = time_pairs([(off, on, args) for _, _, off, on, args, _, _ in built], rounds, steps)
    for (title, fname, off, on, args, result, optimize_s), timing in zip(built, timings):
        (t_off, fast_off, first_off), (t_on, fast_on, first_on), speedup = timing
        p_off, p_on = predicted_seconds(off), predicted_seconds(on)
        kept = choose_program(off.plan, on.plan, "cpu", stable=stable(result, fname)).kept
        fr = result.report[fname]
        sat = fr.saturation
        fired = ", ".join(f"{r} x{n}" for r, n in (sat.top_rules()[:4] if sat else []))
        rows.append(
            [
                title,
                f"{t_off * 1e3:.3f}",
                f"{t_on * 1e3:.3f}",
                f"{speedup:.2f}x",
                f"{p_off / p_on:.2f}x",
                f"{'on' if kept == 'optimized' else 'off'} ({speedup if kept == 'optimized' else 1.0:.2f}x)",
                f"{fr.e_classes} classes, {sat.nodes} nodes" if sat else "-",
                f"{optimize_s:.2f} s",
                fired or "none",
            ]
        )
        programs += [(p_off, t_off, fast_off, first_off), (p_on, t_on, fast_on, first_on)]
        records.append(
            {
                "model": fname.removesuffix("_step"),
                "title": title,
                "predicted_ms": {"off": p_off * 1e3, "on": p_on * 1e3},
                "median_ms": {"off": t_off * 1e3, "on": t_on * 1e3},
                "fastest_ms": {"off": fast_off * 1e3, "on": fast_on * 1e3},
                "measured_speedup": speedup,
                "guard_keeps": kept,
            }
        )
        print(
            f"  {title}: off {t_off * 1e3:.3f} ms, fastest {fast_off * 1e3:.3f}, first {first_off * 1e3:.3f} "
            f"(predicted {p_off * 1e3:.3f}), on {t_on * 1e3:.3f} ms, fastest {fast_on * 1e3:.3f}, first "
            f"{first_on * 1e3:.3f} (predicted {p_on * 1e3:.3f})",
            flush=True,
        )
    mc = machine("cpu")
    cost_model = ("measured profile " + mc.profile) if mc.profile else "shipped defaults"
    return rows, programs, cost_model, records


def first_calls(programs) -> str:
    """How much slower a round's first call is than the calls after it, over the programs."""
    slower = sorted(first / median for _, median, _, first in programs)
    return (
        f"{statistics.median(slower):.2f}x the calls after it (median program; "
        f"{slower[0]:.2f}-{slower[-1]:.2f}x)"
    )


def agreement(predicted, measured) -> str:
    """Spearman rho, and the worst and median factor between prediction and measurement."""
    rho = spearman(predicted, measured) if len(predicted) > 2 else float("nan")
    factors = [max(p / m, m / p) for p, m in zip(predicted, measured) if p > 0 and m > 0]
    return (
        f"Spearman rho {rho:.2f}, prediction / measurement within {max(factors):.2f}x at worst, "
        f"median {statistics.median(factors):.2f}x"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=80)  # a pair takes 1-20 ms: 80 rounds are ~20 s
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--only", nargs="+", choices=[m.__name__ for m in MODELS])
    ap.add_argument("--update", type=Path, help="write the section into this markdown file")
    ap.add_argument("--json", type=Path, help="write each model's predictions and times here")
    args = ap.parse_args(argv)
    rows, programs, cost_model, records = run(args.rounds, args.steps, args.only)
    speedups = [float(r[3][:-1]) for r in rows]
    gmean = math.exp(sum(map(math.log, speedups)) / len(speedups))
    ordinary = [r["measured_speedup"] for r in records if r["model"] not in CONTRIVED]
    ordinary_gmean = math.exp(sum(map(math.log, ordinary)) / len(ordinary))
    guarded = [
        r["measured_speedup"] if r["guard_keeps"] == "optimized" else 1.0
        for r in records
        if r["model"] not in CONTRIVED
    ]
    guarded_gmean = math.exp(sum(map(math.log, guarded)) / len(guarded))
    if args.json:  # the records tests/data/egraph_value_programs.json holds
        args.json.write_text(
            json.dumps({"cost_model": cost_model, "programs": records}, indent=1) + "\n"
        )
    table = markdown_table(
        [
            "model",
            "off ms",
            "on ms",
            "measured speedup",
            "predicted speedup",
            "never slower keeps",
            "e-graph",
            "differentiate + optimize",
            "rules fired (top 4)",
        ],
        rows,
    )
    summary = (
        f"geometric-mean measured speedup {gmean:.2f}x over {len(rows)} models; slowest "
        f"{min(speedups):.2f}x; over the {len(ordinary)} ordinary models (the contrived "
        f"chain aside) {ordinary_gmean:.2f}x, slowest {min(ordinary):.2f}x; with the never-slower "
        f"guard's choice (pipeline/never_slower.py: the off program where the predicted gain is "
        f"within the cost model's error) {guarded_gmean:.2f}x, slowest {min(guarded):.2f}x. Predicted (the planned programs, cost model: {cost_model}) vs "
        f"measured program times ({len(programs)} programs): "
        + agreement([p[0] for p in programs], [p[1] for p in programs])
        + " against the "
        "median rounds (back-to-back calls); "
        + agreement([p[0] for p in programs], [p[2] for p in programs])
        + " against the fastest calls. A round's first call (after the other models' rounds: "
        "caches cold, workers asleep) took " + first_calls(programs) + "."
    )
    stamp = datetime.date.today().isoformat()
    text = (
        f"{SECTION}\n\n`.venv/bin/python benchmarks/egraph_value.py --update BENCHMARKS.md` "
        f"({stamp}; {machine_line()}"
        + (f"; unset {', '.join(UNSET)}" if UNSET else "")
        + ")\n\n"
        + table
        + "\n\n"
        + summary
        + "\n"
    )
    print(text)
    if args.update:
        update_section(args.update, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
