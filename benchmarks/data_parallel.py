"""Data-parallel MLP steps on a local Ray (batch 256 and 2048, 784 -> 256 -> 10, value_and_grad):
steps per second with 1 and 2 workers (one compute thread each), the single-process step for
reference, the communication share of a step and the scaling efficiency.

    .venv/bin/python benchmarks/data_parallel.py                          # prints the table
    .venv/bin/python benchmarks/data_parallel.py --update BENCHMARKS.md   # and writes its section

Every process computes with one thread (DLVM_EQ_NUM_THREADS=1 and one OpenBLAS thread, set
before numpy and dlvm_eq load, and in each worker's environment), so the single-process step
is what one worker computes.
"compute" is the same compiled step on one shard's rows in this process; the communication
share is what the data-parallel step costs beyond that (broadcasting the parameters, sending
shards, fetching and combining gradients, Ray's scheduling): 1 - compute / step. Scaling
efficiency: steps/s with N workers / (N x steps/s with 1 worker). Before timing, each
data-parallel step's result is checked against the single-process step (rtol 1e-5).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import reexec_without

UNSET = reexec_without()  # before numpy loads OpenBLAS
# one compute thread everywhere, BLAS included (Ray gives a 1-CPU worker OMP_NUM_THREADS=1):
# set before numpy and dlvm_eq load, both read them once
for name in ("DLVM_EQ_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[name] = "1"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse  # noqa: E402
import datetime  # noqa: E402

import numpy as np  # noqa: E402
from common import machine_line, markdown_table, median_time, update_section  # noqa: E402

SECTION = "## Data-parallel training on Ray"
READING = (
    "Reading: at batch 256 the step computes for a few milliseconds, less than what a step "
    "moves through Ray's object store (the parameters out, a shard out, each worker's gradients "
    "back, about three times the parameters' size, each a put and a get between processes), so "
    "a worker is several times slower than the single process and a second worker does not "
    "help. At batch 2048 compute dominates one worker's step, but two workers, the driver and "
    "Ray's own processes share two cores (with whatever else runs on this shared machine), so "
    "the second worker's half of the compute is not a free core's: scaling stays well below "
    "100%. Data parallelism pays where each worker has its own cores and a shard's compute "
    "outweighs the gradients' round trip; the communication column is the share to watch."
)
SIZES, BATCHES, WORKERS = (784, 256, 10), (256, 2048), (1, 2)


def problem(batch: int, seed: int = 0):
    from dlvm_eq.models import mlp

    rng = np.random.default_rng(seed)
    x = rng.random((batch, SIZES[0]), dtype=np.float32)
    onehot = np.eye(SIZES[-1], dtype=np.float32)[rng.integers(0, SIZES[-1], batch)]
    return mlp.init_params(list(SIZES), seed=seed), x, onehot


def check(got, want) -> None:
    (value, grads), (want_value, want_grads) = got, want
    assert abs(value - want_value) <= 1e-5 * abs(want_value), (value, want_value)
    for g, w in zip(grads, want_grads):  # float32 sums in another order: compared as vectors
        assert np.linalg.norm(g - w) <= 1e-5 * np.linalg.norm(w)


def measure(batch: int, repeats: int) -> list[list]:
    import dlvm_eq as dq
    from dlvm_eq.distributed import data_parallel
    from dlvm_eq.models import mlp

    params, x, y = problem(batch)
    f = dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3))
    want = f(*params, x, y)
    single = median_time(lambda: f(*params, x, y), repeats=repeats)
    rows = [
        [
            batch,
            "single process",
            "-",
            f"{single.ms:.2f}",
            f"{1e3 / single.ms:.1f}",
            f"{single.ms:.2f}",
            "-",
            "-",
        ]
    ]
    one_worker_rate = None
    for workers in WORKERS:
        shard = -(-batch // workers)  # the largest shard: the step waits for it
        f(*params, x[:shard], y[:shard])  # compiled here first, so the workers hit the cache
        compute = median_time(lambda: f(*params, x[:shard], y[:shard]), repeats=repeats)
        with data_parallel(f, batch_argnums=(4, 5), workers=workers, timeout_s=600) as step:
            check(step(*params, x, y), want)
            timing = median_time(lambda: step(*params, x, y), repeats=repeats)
        rate = 1e3 / timing.ms
        one_worker_rate = one_worker_rate or rate
        efficiency = rate / (workers * one_worker_rate)
        rows.append(
            [
                batch,
                f"{workers} worker{'s' * (workers > 1)}",
                f"{shard}",
                f"{timing.ms:.2f}",
                f"{rate:.1f}",
                f"{compute.ms:.2f}",
                f"{100 * max(0.0, 1 - compute.ms / timing.ms):.0f}%",
                f"{100 * efficiency:.0f}%",
            ]
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30, help="timed steps per row (median)")
    ap.add_argument("--update", type=Path, metavar="BENCHMARKS.md", help="write the section")
    args = ap.parse_args(argv)
    from dlvm_eq.distributed import start_local

    load = os.getloadavg()[0]
    print(f"machine: {machine_line()}; load average {load:.2f}", flush=True)
    ray = start_local(num_cpus=max(WORKERS))
    try:
        rows = [row for batch in BATCHES for row in measure(batch, args.repeats)]
        params = tuple(problem(BATCHES[0])[0])
        put = median_time(lambda: ray.put(params), repeats=args.repeats)
    finally:
        ray.shutdown()
    megabytes = sum(p.nbytes for p in params) / 1e6
    put_line = (
        f"One `ray.put` of the parameters ({megabytes:.2f} MB, what every step "
        f"broadcasts) takes {put.ms:.2f} ms here; a step also puts each shard and "
        f"fetches each worker's gradients (the parameters' size again)."
    )
    print(put_line)
    table = markdown_table(
        [
            "batch",
            "run",
            "rows per worker",
            "ms / step",
            "steps / s",
            "compute ms",
            "communication",
            "scaling efficiency",
        ],
        rows,
    )
    print(table)
    if args.update:
        how_measured = __doc__.split("\n\n", 2)[2].strip()
        command = "python benchmarks/data_parallel.py --update BENCHMARKS.md"
        text = (
            f"{SECTION}\n\nCommand: `{command}`  \nMachine: {machine_line()}; measured "
            f"{datetime.date.today().isoformat()}, load average {load:.2f} before the run. "
            f"A local Ray (`num_cpus=2`) on this 2-core machine, shared with other work: "
            f"noisy, and the driver, Ray's own processes and two workers share two cores.\n\n"
            f"{table}\n\n{put_line}\n\n{READING}\n\n{how_measured}\n"
        )
        update_section(args.update, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
