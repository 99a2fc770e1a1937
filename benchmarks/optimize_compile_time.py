"""Compile time of dq.optimize on generated programs of 10, 100 and 1,000 IR ops, per phase.

    .venv/bin/python benchmarks/optimize_compile_time.py            # prints the table
    .venv/bin/python benchmarks/optimize_compile_time.py --write    # also updates BENCHMARKS.md

Programs are a realistic mix: MLP-like layers (dot + bias + activation), elementwise chains
(with a few algebraic no-ops, as traced code has), softmax-style reductions and residual adds.
Default budgets; the median of --repeat runs (after one warm-up that compiles the rules).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from pathlib import Path

import dlvm_eq as dq
from dlvm_eq.egraph.ruleset_schedule import Budget
from dlvm_eq.ir import F32, Const, FunctionBuilder, Module, tensor, verify

ROOT = Path(__file__).resolve().parent.parent
BATCH, WIDTH = 32, 64


def program(n_ops: int, seed: int = 0) -> Module:
    rng = random.Random(seed)
    b = FunctionBuilder("net", [tensor(BATCH, WIDTH, F32)], ["x"])
    names = iter(f"p{i}" for i in range(10**6))
    params = []

    def param(*shape):
        b.params.append(v := type(b.params[0])(next(names), tensor(*shape, F32)))
        params.append(v)
        return v

    h = b.params[0]
    history = [h]
    while len(b.body) < n_ops - 3:
        kind = rng.choices(["layer", "chain", "softmax", "residual"], [4, 3, 1, 1])[0]
        if kind == "layer":
            z = b.emit("add", [b.emit("dot", [h, param(WIDTH, WIDTH)]), param(WIDTH)])
            h = b.emit(rng.choice(["relu", "tanh", "sigmoid"]), [z])
        elif kind == "chain":
            one = b.emit("multiply", [h, Const.of(1.0, F32)])  # x * 1
            s = b.emit("add", [b.emit("multiply", [one, Const.of(0.5, F32)]), Const.of(0.0, F32)])
            h = b.emit(
                rng.choice(["tanh", "exp", "negate"]), [b.emit("multiply", [s, param(WIDTH)])]
            )
            if rng.random() < 0.5:
                h = b.emit("negate", [b.emit("negate", [h])])
        elif kind == "softmax":
            m = b.emit(
                "padShape",
                [b.emit("reduce", [h], combinator="max", init=float("-inf"), axes=(1,))],
                at=1,
            )
            e = b.emit("exp", [b.emit("subtract", [h, m])])
            n = b.emit(
                "padShape", [b.emit("reduce", [e], combinator="add", init=0.0, axes=(1,))], at=1
            )
            h = b.emit("divide", [e, n])
        else:
            h = b.emit("add", [h, rng.choice(history)])
        history.append(h)
    out = b.emit("reduce", [h], combinator="add", init=0.0, axes=(0, 1))
    fn = b.finish(out)
    m = Module("bench")
    m.add(fn)
    verify(m)
    return m


def chains(n_ops: int, length: int = 12, seed: int = 0) -> Module:
    """The worst case for saturation: matrix chains of random dimensions, one after another
    (associativity makes O(length^3) e-nodes per chain)."""
    rng = random.Random(seed)
    b = FunctionBuilder("net", [tensor(16, 16, F32)], ["x"])
    h, k = b.params[0], 0
    while len(b.body) < n_ops - length - 2:
        dims = [16] + [rng.randint(2, 64) for _ in range(length - 1)] + [16]
        for i in range(length):
            b.params.append(w := type(h)(f"w{k}", tensor(dims[i], dims[i + 1], F32)))
            k += 1
            h = b.emit("dot", [h, w])
        h = b.emit("tanh", [h])
    m = Module("chains")
    m.add(b.finish(b.emit("reduce", [h], combinator="add", init=0.0, axes=(0, 1))))
    return m


def measure(n_ops: int, repeat: int, kind: str = "mix"):
    m = program(n_ops) if kind == "mix" else chains(n_ops)
    ops = len(m["net"].body)
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = dq.optimize(m)
        total = time.perf_counter() - t0
        fr = r.report["net"]
        runs.append((total, fr))
    total, fr = sorted(runs, key=lambda x: x[0])[len(runs) // 2]
    ph = fr.seconds
    return {
        "kind": kind,
        "ops": ops,
        "total": total,
        "load": ph["load"],
        "saturate": ph["saturate"],
        "extract": ph["serialize"] + ph["extract"],
        "unload": ph["unload"],
        "baseline": ph["baseline"],
        "recost": ph.get("recost", 0.0),
        "stop": fr.saturation.stop_reason,
        "iters": fr.saturation.iterations,
        "nodes": f"{fr.saturation.nodes_before}->{fr.saturation.nodes}",
        "classes": fr.e_classes,
        "speedup": fr.speedup,
        "ops_after": fr.ops_after,
    }


def table(rows) -> str:
    head = (
        "| program | IR ops | total s | load | baseline | saturate | extract | unload | recost | stop (iterations) "
        "| e-nodes | e-classes | ops after | est. speedup |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['ops']} | {r['total']:.2f} | {r['load']:.3f} | {r['baseline']:.3f} | {r['saturate']:.3f} | "
            f"{r['extract']:.3f} | {r['unload']:.3f} | {r['recost']:.3f} | {r['stop']} ({r['iters']}) | "
            f"{r['nodes']} | {r['classes']} | {r['ops_after']} | x{r['speedup']:.2f} |"
        )
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return platform.machine()


SECTION = "## Optimizer"


def write_section(text: str) -> None:
    path = ROOT / "BENCHMARKS.md"
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    start = doc.find(SECTION + "\n")
    if start < 0:
        doc = doc.rstrip("\n") + "\n\n" + text + "\n"
    else:
        nxt = doc.find("\n## ", start + len(SECTION))
        doc = doc[:start] + text + ("\n" + doc[nxt + 1 :] if nxt >= 0 else "\n")
    path.write_text(doc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-chains", action="store_true", help="skip the matrix-chain worst case")
    ap.add_argument(
        "--write", action="store_true", help="update the Optimizer section of BENCHMARKS.md"
    )
    args = ap.parse_args(argv)
    dq.optimize(program(10))  # warm-up: compiles the rule files once
    rows = [measure(n, args.repeat) for n in args.sizes]
    if not args.no_chains:
        rows.append(measure(max(args.sizes), args.repeat, "chains"))
    b = Budget()
    load = os.getloadavg()[0]
    text = (
        f"{SECTION}\n\n`dq.optimize` compile time on generated programs (MLP-like layers, elementwise "
        f"chains with algebraic no-ops, softmax reductions, residual adds; batch {BATCH}, width {WIDTH}), "
        f"and a worst case for saturation (`chains`: 12-matrix chains of random dimensions, one after "
        f"another); default budgets (iterations {b.iterations}, e-nodes {b.nodes}, {b.seconds:g} s), target cpu, "
        f"greedy extraction; seconds, median of {args.repeat}. `baseline` and `recost` price the program "
        f"as written and as optimized (the never-worse check); `extract` includes serializing the "
        f"e-graph; est. speedup is the cost model's. Target: 1,000 ops under 10 s.\n\n"
        f"Command: `.venv/bin/python benchmarks/optimize_compile_time.py --write`  \n"
        f"Machine: {cpu_name()}, Python {platform.python_version()}, measured {time.strftime('%Y-%m-%d')} "
        f"with a load average of {load:.1f} (a shared machine: an idle one is faster).\n\n{table(rows)}\n"
    )
    print(text)
    if args.write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
