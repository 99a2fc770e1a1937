"""A busy machine: the MLP training step and the fused elementwise chain, quiet and while one
other process spins on one core, dlvm_eq against numpy, PyTorch eager and JAX side by side in
one run; plus numpy's step right after a dlvm_eq step in the same process against numpy alone
(our worker threads and OpenBLAS's sharing two cores).

    .venv/bin/python benchmarks/contention.py                         # prints the tables
    .venv/bin/python benchmarks/contention.py --update BENCHMARKS.md  # and writes its section

Every figure comes from a fresh process (a probe: `--probe WORKLOAD IMPL`) that checks its
implementation against a float64 reference, warms up and prints the median of --steps calls.
The conditions take turns round by round (quiet, busy, quiet, busy, ...), so slow drifts of the
machine hit both alike; a row's figure is the median of its rounds. "Busy" is a Python process
spinning at 100% that this script starts, pins to the last CPU and kills after each probe.
OpenBLAS's OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE overrides are removed (the script restarts
itself without them), as in the other benchmarks.

"no rest" rows: the same with threads.RESTING = False, i.e. the native pool's workers left
to spin out their budget after each compiled call instead of sleeping when it returns.

Targets (issue 11): dlvm_eq's MLP step busy/quiet <= 1.25 and its busy time <= every peer's;
numpy's step right after dlvm_eq's within 1.1x of numpy alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import reexec_without

UNSET = reexec_without()  # before numpy loads OpenBLAS

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from common import Busy, machine_line, markdown_table, median_time, update_section  # noqa: E402

SECTION = "## Contention: a busy core, and numpy beside dlvm_eq"
HERE = Path(__file__).resolve()
CHAIN_N = 10_000_000
WORKLOADS = {
    "mlp": ["dlvm_eq", "dlvm_eq, no rest", "numpy", "torch", "jax"],
    "chain": ["dlvm_eq", "numpy", "torch", "jax"],
    "coexist": ["numpy alone", "numpy after dlvm_eq", "numpy after dlvm_eq, no rest"],
}
TITLES = {
    "mlp": "MLP training step (batch 256, 784 -> 256 -> 10, value_and_grad + SGD)",
    "chain": "elementwise chain `sigmoid(x*1.5 + 0.25) * x`, 10M float32",
}


# ---------------------------------------------------------------- probes (one per process)


def no_rest(name: str) -> str:
    """ "X, no rest": X with the workers left spinning after each compiled call (the switch
    threads.RESTING; by default they are put to sleep when a call returns)."""
    if name.endswith(", no rest"):
        from dlvm_eq.codegen.runtime import threads

        threads.RESTING = False
        return name[: -len(", no rest")]
    return name


def mlp_impl(name: str):
    """A checked mlp_step implementation: `step()` and `sync(out)`."""
    import mlp_step as m

    name = no_rest(name)
    params, x, y = m.data()
    impl = {
        "dlvm_eq": lambda: m.DlvmEq(params, x, y, "cpu"),
        "numpy": lambda: m.NumpyHandWritten(params, x, y),
        "torch": lambda: m.Torch(params, x, y, compiled=False),
        "jax": lambda: m.Jax(params, x, y),
    }[name]()
    problem = m.check(impl, m.reference(params, x, y))
    if problem:
        raise SystemExit(f"{name}: wrong result: {problem}")
    return impl


def chain_impl(name: str):
    """(fn, sync) computing sigmoid(x*1.5 + 0.25) * x on 10M float32, checked first."""
    x = np.random.default_rng(0).standard_normal(CHAIN_N, dtype=np.float32)
    sync = lambda out: out
    if name == "dlvm_eq":
        import dlvm_eq as dq

        f = dq.jit(lambda v: dq.sigmoid(v * 1.5 + 0.25) * v)
        fn = lambda: f(x)
    elif name == "numpy":
        fn = lambda: x / (1 + np.exp(-(x * 1.5 + 0.25)))
    elif name == "torch":
        import torch

        tx = torch.from_numpy(x)
        fn = lambda: torch.sigmoid(tx * 1.5 + 0.25) * tx
    else:
        import jax
        import jax.numpy as jnp

        jx = jnp.asarray(x)
        jf = jax.jit(lambda v: jax.nn.sigmoid(v * 1.5 + 0.25) * v)
        fn, sync = (lambda: jf(jx)), jax.block_until_ready
    x64 = x.astype(np.float64)
    want = x64 / (1 + np.exp(-(x64 * 1.5 + 0.25)))
    got = np.asarray(sync(fn()), dtype=np.float64)
    if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
        raise SystemExit(f"{name}: wrong result, max abs error {np.max(np.abs(got - want)):.3g}")
    return fn, sync


def probe(workload: str, name: str, steps: int) -> dict:
    if workload == "mlp":
        impl = mlp_impl(name)
        t = median_time(impl.step, repeats=steps, warmup=5, sync=impl.sync)
    elif workload == "chain":
        fn, sync = chain_impl(name)
        t = median_time(fn, repeats=steps, warmup=3, sync=sync)
    else:
        # numpy's hand-written step, alone or each time right after one dlvm_eq step
        numpy_step = mlp_impl("numpy")
        name = no_rest(name)
        if name == "numpy alone":
            t = median_time(numpy_step.step, repeats=steps, warmup=5)
        else:
            ours = mlp_impl("dlvm_eq")
            times = []
            for i in range(steps + 5):
                ours.step()
                t0 = time.perf_counter()
                numpy_step.step()
                if i >= 5:
                    times.append(time.perf_counter() - t0)
            return {"median_s": statistics.median(times)}
    return {"median_s": t.median}


# ---------------------------------------------------------------- the driver


def run_probe(workload: str, name: str, steps: int) -> float | str:
    """Median seconds from a fresh process, or the reason it failed."""
    cmd = [sys.executable, str(HERE), "--probe", workload, name, "--steps", str(steps)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
    return json.loads(r.stdout.strip().splitlines()[-1])["median_s"]


def measure(args) -> dict:
    """{(workload, name, condition): [median seconds per round] or a failure string}."""
    results: dict = {}
    for rnd in range(args.rounds):
        for condition in ("quiet", "busy"):
            for workload, names in WORKLOADS.items():
                if workload == "coexist" and condition == "busy":
                    continue
                steps = args.steps if workload != "chain" else max(10, args.steps // 3)
                for name in names:
                    if condition == "busy":
                        with Busy():
                            got = run_probe(workload, name, steps)
                    else:
                        got = run_probe(workload, name, steps)
                    key = (workload, name, condition)
                    if isinstance(got, str):
                        results[key] = got
                    elif not isinstance(results.get(key), str):
                        results.setdefault(key, []).append(got)
                    print(
                        f"round {rnd + 1} {condition:5s} {workload:7s} {name:20s} "
                        + (got if isinstance(got, str) else f"{got * 1e3:.3f} ms"),
                        flush=True,
                    )
    return results


def ms(results, key) -> float | None:
    v = results.get(key)
    return statistics.median(v) * 1e3 if isinstance(v, list) and v else None


def fmt(v: float | None, digits: int = 3) -> str | None:
    return None if v is None else f"{v:.{digits}f}"


def workload_table(results, workload: str) -> tuple[str, dict]:
    ours_busy = ms(results, (workload, "dlvm_eq", "busy"))
    rows, figures = [], {}
    for name in WORKLOADS[workload]:
        quiet, busy = ms(results, (workload, name, "quiet")), ms(results, (workload, name, "busy"))
        failure = next(
            (
                results[(workload, name, c)]
                for c in ("quiet", "busy")
                if isinstance(results.get((workload, name, c)), str)
            ),
            "",
        )
        figures[name] = (quiet, busy)
        rows.append(
            [
                name,
                fmt(quiet),
                fmt(busy),
                fmt(busy / quiet, 2) + "x" if quiet and busy else None,
                fmt(busy / ours_busy, 2) + "x" if busy and ours_busy else None,
                failure,
            ]
        )
    table = markdown_table(
        [
            "implementation",
            "quiet ms",
            "one core busy ms",
            "busy / quiet",
            "busy / dlvm_eq busy",
            "note",
        ],
        rows,
    )
    return table, figures


def section(results, args) -> str:
    parts = [
        SECTION,
        "",
        f"`.venv/bin/python benchmarks/contention.py --update BENCHMARKS.md` "
        f"({datetime.date.today().isoformat()}; {args.rounds} rounds, medians of round medians; "
        f'each figure from its own process; "busy": one process spinning on the last CPU). '
        f"{machine_line()}." + (f" Removed for this run: {', '.join(UNSET)}." if UNSET else ""),
        "",
    ]
    verdicts = []
    for workload in ("mlp", "chain"):
        table, figures = workload_table(results, workload)
        parts += [f"### {TITLES[workload]}", "", table, ""]
        quiet, busy = figures.get("dlvm_eq", (None, None))
        if workload == "mlp" and quiet and busy:
            peers_busy = [b for n, (_, b) in figures.items() if not n.startswith("dlvm_eq") and b]
            verdicts.append(
                f"MLP step busy / quiet = {busy / quiet:.2f} (target <= 1.25: "
                f"{'met' if busy / quiet <= 1.25 else 'NOT met'})"
            )
            if peers_busy:
                verdicts.append(
                    f"dlvm_eq busy {busy:.3f} ms vs the fastest peer busy {min(peers_busy):.3f} ms "
                    f"(target <= every peer: {'met' if busy <= min(peers_busy) else 'NOT met'})"
                )
    alone, after = (
        ms(results, ("coexist", "numpy alone", "quiet")),
        ms(results, ("coexist", "numpy after dlvm_eq", "quiet")),
    )
    spinning = ms(results, ("coexist", "numpy after dlvm_eq, no rest", "quiet"))

    def rounds(name):
        v = results.get(("coexist", name, "quiet"))
        return ", ".join(f"{x * 1e3:.2f}" for x in v) if isinstance(v, list) else None

    rows = [
        ["numpy step alone", fmt(alone), "1.00x" if alone else None, rounds("numpy alone")],
        [
            "numpy step, each right after one dlvm_eq step",
            fmt(after),
            fmt(after / alone, 2) + "x" if alone and after else None,
            rounds("numpy after dlvm_eq"),
        ],
        [
            "the same, our workers left spinning after each call (no rest)",
            fmt(spinning),
            fmt(spinning / alone, 2) + "x" if alone and spinning else None,
            rounds("numpy after dlvm_eq, no rest"),
        ],
    ]
    parts += [
        "### numpy beside dlvm_eq in one process (quiet)",
        "",
        markdown_table(["what is timed", "median ms", "/ numpy alone", "round medians ms"], rows),
        "",
    ]
    if alone and after:
        verdicts.append(
            f"numpy after dlvm_eq / numpy alone = {after / alone:.2f} (target <= 1.1: "
            f"{'met' if after / alone <= 1.1 else 'NOT met'})"
        )
    parts += ["Targets: " + "; ".join(verdicts) + "." if verdicts else "", ""]
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", nargs=2, metavar=("WORKLOAD", "IMPL"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--steps", type=int, default=60, help="timed calls per probe (MLP; chain: a third)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--update", type=Path, help="write the section into this markdown file")
    args = ap.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(*args.probe, args.steps)))
        return 0
    results = measure(args)
    text = section(results, args)
    print("\n" + text)
    if args.update:
        update_section(args.update, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
