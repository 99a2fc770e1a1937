"""Compile time against program depth (issue 12): the tanh-chain gradient, long `.dl` chains
through the command line, and parse time. Every compile runs in a fresh process with an empty
cache directory (cold: no IR, plan or object-code entries).

    .venv/bin/python benchmarks/deep_programs.py                          # prints the tables
    .venv/bin/python benchmarks/deep_programs.py --update BENCHMARKS.md   # also writes its section
    .venv/bin/python benchmarks/deep_programs.py --quick                  # smaller sizes

Targets: growth linear; the 30-layer gradient compiles in < 2 s cold; a 10k-instruction chain
in < 20 s; parsing <= 3 s per 100k instructions.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, markdown_table, update_section

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Deep programs"
T = "<4 x 8 x f32>"

# The first call of dq.jit(dq.grad(deep)) on 6 floats: trace, differentiate, optimize, plan,
# build kernels, run. Printed by the child as one number.
TANH_CHILD = """
import sys, time
import numpy as np
t0 = time.perf_counter()
import dlvm_eq as dq
n = int(sys.argv[1])
def deep(x):
    for _ in range(n):
        x = dq.tanh(x * x + x)
    return dq.sum(x)
x = np.linspace(-0.5, 0.5, 6).astype(np.float32)
t1 = time.perf_counter()
g = dq.jit(dq.grad(deep))(x)
t2 = time.perf_counter()
want = dq.jit(dq.grad(deep), target="interp")(x)
assert np.allclose(g, want, rtol=1e-3, atol=1e-6), (g, want)
print(f"{t2 - t1:.3f} {t1 - t0:.3f}")
"""


def chain_text(n: int) -> str:
    """A straight chain of n elementwise instructions (multiply, add, tanh)."""
    lines = [
        'module "chain"',
        "stage raw",
        "",
        f"func @chain: ({T}, {T}) -> {T} {{",
        f"'entry(%x: {T}, %y: {T}):",
    ]
    prev = "%x"
    for i in range(n):
        rhs = (
            f"multiply {prev}: {T}, 0.999: f32",
            f"add {prev}: {T}, %y: {T}",
            f"tanh {prev}: {T}",
        )[i % 3]
        lines.append(f"    %v{i} = {rhs}")
        prev = f"%v{i}"
    return "\n".join(lines + [f"    return {prev}: {T}", "}", ""])


MEMORY_LIMIT = 8 << 30  # bytes of address space per child: a shared machine stays usable


def _limit_memory():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _failure(r) -> str:
    last = (r.stderr.strip().splitlines() or ["?"])[-1]
    if "MemoryError" in r.stderr or r.returncode < 0:
        return (
            f"over the {MEMORY_LIMIT >> 30} GiB memory limit"
            if "MemoryError" in r.stderr
            else f"killed by signal {-r.returncode}"
        )
    return "failed: " + last[:80]


def _env(cache: str) -> dict:
    env = dict(os.environ, DLVM_EQ_CACHE_DIR=cache)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def tanh_chain(n: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="dq-deep-") as cache:
        try:
            r = subprocess.run(
                [sys.executable, "-c", TANH_CHILD, str(n)],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=_env(cache),
                cwd=ROOT,
                preexec_fn=_limit_memory,
            )
        except subprocess.TimeoutExpired:
            return {"n": n, "compile": None, "note": f"over {timeout:.0f} s"}
    if r.returncode != 0:
        return {"n": n, "compile": None, "note": _failure(r)}
    compile_s, import_s = map(float, r.stdout.split()[-2:])
    return {"n": n, "compile": compile_s, "note": f"import {import_s:.2f} s"}


def dl_chain(n: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="dq-deep-") as tmp:
        src = Path(tmp) / f"chain{n}.dl"
        src.write_text(chain_text(n))
        cache = str(Path(tmp) / "cache")
        t0 = time.perf_counter()
        try:
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "dlvm_eq.cli",
                    "run",
                    str(src),
                    "-f",
                    "chain",
                    "--random",
                    "--target",
                    "cpu",
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=_env(cache),
                cwd=ROOT,
                preexec_fn=_limit_memory,
            )
        except subprocess.TimeoutExpired:
            return {"n": n, "wall": None, "note": f"over {timeout:.0f} s"}
        wall = time.perf_counter() - t0
    if r.returncode != 0:
        return {"n": n, "wall": None, "note": _failure(r)}
    return {"n": n, "wall": wall, "note": ""}


def parse_time(n: int) -> dict:
    from dlvm_eq.ir.parser import parse

    parse(chain_text(3))  # builds the parser once
    text = chain_text(n)
    t0 = time.perf_counter()
    m = parse(text, "chain.dl")
    s = time.perf_counter() - t0
    assert len(m["chain"].body) == n
    return {"n": n, "parse": s, "per100k": s * 100_000 / n}


def _fmt(v, digits=2):
    return None if v is None else f"{v:.{digits}f}"


def report(grads, chains, parses) -> str:
    rows = [
        [
            r["n"],
            _fmt(r["compile"]),
            _fmt(r["compile"] / r["n"] * 1000, 1) if r["compile"] is not None else None,
            r["note"],
        ]
        for r in grads
    ]
    t1 = markdown_table(["layers n", "first call s (cold)", "ms per layer", "note"], rows)
    rows = [
        [
            f"{r['n']:,}",
            _fmt(r["wall"]),
            _fmt(r["wall"] / r["n"] * 1000, 2) if r["wall"] else None,
            r["note"],
        ]
        for r in chains
    ]
    t2 = markdown_table(
        ["instructions", "`dlvm-eq run --target cpu` wall s (cold)", "ms per instruction", "note"],
        rows,
    )
    rows = [[f"{r['n']:,}", _fmt(r["parse"], 3), _fmt(r["per100k"])] for r in parses]
    t3 = markdown_table(["instructions", "parse s", "s per 100k instructions"], rows)
    return "\n\n".join(
        [
            f"Machine: {machine_line()}. Shared by several engineers while measured: noisy.  \n"
            "Command: `.venv/bin/python benchmarks/deep_programs.py --update BENCHMARKS.md`",
            "`for _ in range(n): x = dq.tanh(x * x + x)`, then `dq.jit(dq.grad(deep))` on 6 floats, "
            "first call in a fresh process with an empty cache (trace, differentiate, optimize, plan, "
            "build kernels, run; the import is not counted). Target: 30 layers < 2 s.",
            t1,
            "A straight chain of elementwise instructions (multiply, add, tanh on 4 x 8 f32) through "
            "`dlvm-eq run FILE -f chain --random --target cpu`, a fresh process and an empty cache "
            "(process start and import included). Target: 10k instructions < 20 s.",
            t2,
            "Parsing the same chains (`dlvm_eq.ir.parser.parse`, in one process, the parser built "
            "beforehand). Target: <= 3 s per 100k instructions.",
            t3,
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="n up to 64 and chains up to 10k")
    p.add_argument("--timeout", type=float, default=600, help="seconds per compile (default 600)")
    p.add_argument("--update", metavar="BENCHMARKS.md")
    args = p.parse_args()
    layers = [8, 16, 32, 64] + ([] if args.quick else [128, 256])
    sizes = [1_000, 10_000] + ([] if args.quick else [100_000])
    grads = []
    for n in layers:
        grads.append(tanh_chain(n, args.timeout))
        print("tanh chain", grads[-1], flush=True)
    chains = []
    for n in sizes:
        chains.append(dl_chain(n, args.timeout))
        print(".dl chain", chains[-1], flush=True)
    parses = []
    for n in sizes:
        parses.append(parse_time(n))
        print("parse", parses[-1], flush=True)
    text = report(grads, chains, parses)
    print("\n" + text)
    if args.update:
        update_section(Path(args.update), SECTION, f"{SECTION}\n\n{text}")


if __name__ == "__main__":
    main()
