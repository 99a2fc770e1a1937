"""dq.vmap of a function with a scan (a tanh RNN over T steps, per example) against a Python
loop calling the jitted per-example function B times, and JAX's jax.vmap of lax.scan when
JAX is installed. Hidden 64, T 32, float32, target cpu; the programs alternate round by round.

    python benchmarks/vmap_scan.py
    python benchmarks/vmap_scan.py --update BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, markdown_table, update_section

HIDDEN, STEPS = 64, 32
HEADING = "## dq.vmap of a scan (issue 30)"


def programs(batch: int):
    import numpy as np

    import dlvm_eq as dq

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((HIDDEN, HIDDEN)) * 0.1).astype(np.float32)
    h0 = np.zeros(HIDDEN, np.float32)
    xs = rng.standard_normal((batch, STEPS, HIDDEN)).astype(np.float32)

    def rnn(w, h0, xs):
        return dq.scan(lambda h, x: (dq.tanh(h @ w + x), None), h0, xs)[0]

    one = dq.jit(rnn)
    many = dq.jit(dq.vmap(rnn, in_axes=(None, None, 0)))
    out = {
        "dq.vmap": lambda: many(w, h0, xs),
        "loop of dq.jit": lambda: np.stack([one(w, h0, xs[b]) for b in range(batch)]),
    }
    try:
        import jax
        import jax.numpy as jnp

        def jrnn(w, h0, xs):
            return jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x), None), h0, xs)[0]

        jv = jax.jit(jax.vmap(jrnn, in_axes=(None, None, 0)))
        out["jax.vmap"] = lambda: jv(w, h0, xs).block_until_ready()
    except ImportError:
        pass
    want = out["loop of dq.jit"]()
    for f in out.values():
        np.testing.assert_allclose(np.asarray(f()), want, rtol=1e-4, atol=1e-5)
    return out


def run(batches=(16,), rounds: int = 15) -> list[list]:
    rows = []
    for batch in batches:
        progs = programs(batch)
        times = {k: [] for k in progs}
        for _ in range(rounds):
            for name, f in progs.items():
                t0 = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
        base = statistics.median(times["loop of dq.jit"])
        for name, ts in times.items():
            m = statistics.median(ts)
            rows.append([batch, name, f"{m * 1e3:.2f}", f"{m / base:.2f}x"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[16])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--update", type=Path, help="write the section into this markdown file")
    a = ap.parse_args()
    load = os.getloadavg()[0]
    table = markdown_table(
        ["B", "program", "ms (median)", "time / loop of dq.jit"], run(a.batch, a.rounds)
    )
    text = (
        f"{HEADING}\n\nCommand: `python benchmarks/vmap_scan.py --update BENCHMARKS.md`  \n"
        f"Machine: {machine_line()}; load average {load:.2f} before the run (a shared machine).\n\n"
        f"{__doc__.split(chr(10) + chr(10))[0]}\n\n{table}\n"
    )
    print(text)
    if a.update:
        update_section(a.update, HEADING, text)


if __name__ == "__main__":
    main()
