"""Compile time and memory: cold and warm compiles of training steps, each in a fresh process,
against JAX's jit and torch.compile (cold, empty caches) in the same run, and the tanh-chain
gradient's growth with depth.

    .venv/bin/python benchmarks/compile_time.py                         # prints the tables
    .venv/bin/python benchmarks/compile_time.py --trees /old/checkout . # before/after, same run
                                                  # (and whether the printed plans are the same)
    .venv/bin/python benchmarks/compile_time.py --profile               # and each phase's time
    .venv/bin/python benchmarks/compile_time.py --programs cnn transformer --depths  # those only
    .venv/bin/python benchmarks/compile_time.py --update BENCHMARKS.md  # writes its section
    .venv/bin/python benchmarks/compile_time.py --rounds 0 --depths 64 256 --trees old .
                                                  # the depth table only, trees alternating

Each measurement is a fresh Python process (`dlvm_eq` imported from the tree given, its import
not counted): cold has an empty cache directory; warm is a second process on the directory the
cold one filled. A compile is timed from `dq.jit(...)` to the first result of the first call.
JAX's warm is the same: its cold process runs with JAX's persistent compilation cache in the
cache directory (every entry kept, however short its compile), and a second process reads it.
The warm row has three figures, all from the warm process: the time to the first result, a
steady step of the same program (the median of --steady further calls, in the same process),
and their difference, the warm overhead: what the first call costs beyond a step (loading,
first touches of fresh memory, thread starts). Each in wall time and in the main thread's CPU
time (JAX: the process's, its work runs on XLA's threads), the steadier figure under load.
Peak RSS is the process's (getrusage) after the first call. Python bytecode is cached (as after
an install): a first discarded run per tree writes it. Trees and peers take turns, round by
round; the tables show medians over --rounds.

| program | what is compiled |
|---|---|
| MLP step | `jit` of value_and_grad + SGD, 784-256-10 ReLU, batch 256, softmax cross-entropy |
| CNN step | benchmarks/models.py CNN: conv 3x3 32, pool, conv 3x3 64, pool, dense 10, batch 128 |
| transformer step | benchmarks/models.py encoder layer: batch 16, seq 128, d 256, 4 heads, MLP 1024 |
| tanh chain N | `jit(grad(f))`, f = N times `x = tanh(x * x + x)` on 6 floats, then sum |
"""

from __future__ import annotations

import argparse
import datetime
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECTION = "## Compile time (cold, warm, against JAX)"
PROGRAMS = ("mlp", "cnn", "transformer", "tanh30")
DEPTHS = (8, 16, 32, 64, 128, 256)
PYC = Path(tempfile.gettempdir()) / "dlvm_eq-bench-pycache"

# One measurement: argv = framework, program, steady calls. Prints one JSON line.
CHILD = r"""
import sys, time, json, resource, os, statistics
sys.path.insert(0, BENCH)
framework, program, steady_calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
import numpy as np
t0 = time.perf_counter()
if framework == "dlvm_eq":
    import dlvm_eq as dq
elif framework == "torch":
    import torch
else:
    import jax, jax.numpy as jnp
    # the persistent compilation cache, in this compile's cache directory: the cold process
    # writes every entry (none is too quick to keep), the warm one reads them
    jax.config.update("jax_compilation_cache_dir", os.path.join(os.environ["DLVM_EQ_CACHE_DIR"], "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
imported = time.perf_counter() - t0
rng = np.random.default_rng(0)
if program == "mlp":
    from dlvm_eq.models.mlp import init_params
    params = init_params([784, 256, 10])
    x = rng.random((256, 784), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
    args = (*params, x, y)
elif program in ("cnn", "transformer"):
    import models
    model = models.MODELS[program]
    params, (x, y) = model.params(), model.data()
    args = (params, x, y)
else:
    depth = int(program[4:])
    args = (np.linspace(-0.5, 0.5, 6).astype(np.float32),)
phases, plan, again = {}, None, None  # again(): one more step, its result ready
c1 = time.process_time()  # CPU time of the compile (all threads): steadier than wall under load
m1 = time.thread_time()  # the main thread's alone: no helper thread's spinning or waiting
if framework == "dlvm_eq":
    t1 = time.perf_counter()
    if program == "mlp":
        from dlvm_eq.models.mlp import loss
        vg = dq.value_and_grad(loss, argnums=(0, 1, 2, 3))
        def step(w1, b1, w2, b2, x, y):
            value, grads = vg(w1, b1, w2, b2, x, y)
            return value, tuple(p - 0.01 * g for p, g in zip((w1, b1, w2, b2), grads))
        f = dq.jit(step)
    elif program in ("cnn", "transformer"):
        f = models.dlvm_step_functions(model)[1]
    else:
        def deep(x):
            for _ in range(depth):
                x = dq.tanh(x * x + x)
            return dq.sum(x)
        f = dq.jit(dq.grad(deep))
    out = f(*args)
    seconds = time.perf_counter() - t1
    cpu, main = time.process_time() - c1, time.thread_time() - m1
    again = lambda: f(*args)  # the same arguments: the step's own time, what the first includes
elif framework == "torch":  # a training step's forward compiled, its backward by AOTAutograd
    t1 = time.perf_counter()
    if program == "mlp":
        ps = [torch.tensor(a, requires_grad=True) for a in args[:4]]
        tx, ty = torch.from_numpy(args[4]), torch.from_numpy(args[5])
        def loss(w1, b1, w2, b2, x, y):
            z = torch.relu(x @ w1 + b1) @ w2 + b2
            return torch.mean(-torch.sum(torch.log_softmax(z, dim=1) * y, dim=1))
        value = torch.compile(loss)(*ps, tx, ty)
        value.backward()
        with torch.no_grad():
            out = [p - 0.01 * p.grad for p in ps]
    elif program in ("cnn", "transformer"):
        models.Torch(model, params, x, y, compiled=True).step()
    else:
        tx = torch.tensor(args[0], requires_grad=True)
        def deep(x):
            for _ in range(depth):
                x = torch.tanh(x * x + x)
            return torch.sum(x)
        torch.compile(deep)(tx).backward()
        out = tx.grad
    seconds = time.perf_counter() - t1
else:
    t1 = time.perf_counter()
    if program == "mlp":
        def loss(w1, b1, w2, b2, x, y):
            z = jax.nn.relu(x @ w1 + b1) @ w2 + b2
            return jnp.mean(-jnp.sum(jax.nn.log_softmax(z) * y, axis=1))
        @jax.jit
        def f(w1, b1, w2, b2, x, y):
            value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(w1, b1, w2, b2, x, y)
            return value, tuple(p - 0.01 * g for p, g in zip((w1, b1, w2, b2), grads))
        out = jax.block_until_ready(f(*args))
        again = lambda: jax.block_until_ready(f(*args))
    elif program in ("cnn", "transformer"):
        jx = models.Jax(model, params, x, y)  # compiles and runs its train step once
        again = lambda: jax.block_until_ready(jx.train_step(jx.p, jx.x, jx.y))
    else:
        def deep(x):
            for _ in range(depth):
                x = jnp.tanh(x * x + x)
            return jnp.sum(x)
        g = jax.jit(jax.grad(deep))
        out = jax.block_until_ready(g(*args))
        again = lambda: jax.block_until_ready(g(*args))
    seconds = time.perf_counter() - t1
if framework != "dlvm_eq":
    cpu, main = time.process_time() - c1, time.thread_time() - m1
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
steady = []  # (wall, process CPU, main thread CPU) of each further step
for _ in range(steady_calls if again is not None else 0):
    t2, c2, m2 = time.perf_counter(), time.process_time(), time.thread_time()
    again()
    steady.append((time.perf_counter() - t2, time.process_time() - c2, time.thread_time() - m2))
if framework == "dlvm_eq":
    phases = getattr(f.report(*args), "phases", {})
    import re  # the printed plan, less the fusion stage's wall time: compared across trees
    plan = re.sub(r"; [0-9.]+ ms", "", str(f.report(*args).plan))
mid = lambda i: statistics.median(s[i] for s in steady) if steady else None
print(json.dumps({"seconds": seconds, "cpu": cpu, "main": main, "import": imported,
                  "rss_mb": rss, "phases": phases, "plan": plan, "step": mid(0),
                  "step_cpu": mid(1), "step_main": mid(2)}))
"""


def child(
    tree: Path, framework: str, program: str, cache: str, timeout: float, steady: int = 0
) -> dict:
    from common import child_json

    env = {
        "PYTHONPYCACHEPREFIX": str(PYC),  # bytecode cached outside the trees, as after an install
        "JAX_PLATFORMS": "cpu",
        "TORCHINDUCTOR_CACHE_DIR": str(Path(cache) / "inductor"),  # torch.compile's cold: empty
    }
    code = CHILD.replace("BENCH", repr(str(HERE)))
    return child_json(tree, code, [framework, program, str(steady)], cache, env, timeout)


def cold_and_warm(
    tree: Path, program: str, timeout: float, steady: int = 0, framework: str = "dlvm_eq"
) -> tuple[dict, dict]:
    """A cold compile on an empty cache directory, then a warm one on what it left there;
    the warm process also times `steady` further steps."""
    with tempfile.TemporaryDirectory(prefix="dq-compile-") as cache:
        cold = child(tree, framework, program, cache, timeout)
        warm = child(tree, framework, program, cache, timeout, steady)
    return cold, warm


PEERS = {"jax": ("import jax", "JAX jit"), "torch": ("import torch", "torch.compile")}


def installed_peers(names) -> list[str]:
    """The peers (jax, torch) among `names` this interpreter can import."""
    return [
        n
        for n in names
        if subprocess.run([sys.executable, "-c", PEERS[n][0]], capture_output=True).returncode == 0
    ]


def peer(framework: str, program: str, timeout: float, steady: int = 0) -> tuple[dict, dict | None]:
    """A peer's cold compile in a fresh process with an empty cache directory of its own
    (torch.compile's inductor cache lives there), and for JAX a warm one on the persistent
    compilation cache the cold one wrote (None for torch.compile: cold only)."""
    if framework == "jax":
        return cold_and_warm(ROOT, program, timeout, steady, framework)
    with tempfile.TemporaryDirectory(prefix="dq-peer-") as cache:
        return child(ROOT, framework, program, cache, timeout), None


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _nan_median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def warm_figures(rows: list[dict], first: str, step: str) -> tuple[float, float, float]:
    """Medians of the warm processes' first result, steady step, and warm overhead (each
    process's first less its own steady step), by the keys `first` and `step` of each row
    (seconds; nan where a row lacks them: older bench output)."""
    return (
        _nan_median(r.get(first) for r in rows),
        _nan_median(r.get(step) for r in rows),
        _nan_median(
            r[first] - r[step] for r in rows if r.get(first) is not None and r.get(step) is not None
        ),
    )


def warm_text(rows: list[dict]) -> tuple[str, str, str]:
    """The warm row's cells: wall s (first / step / overhead), main-thread CPU ms and process
    CPU ms (the same three)."""
    wall = "{:.3f} / {:.3f} / {:.3f}".format(*warm_figures(rows, "seconds", "step"))
    main = "{:.0f} / {:.0f} / {:.0f}".format(
        *(v * 1e3 for v in warm_figures(rows, "main", "step_main"))
    )
    cpu = "{:.0f} / {:.0f} / {:.0f}".format(
        *(v * 1e3 for v in warm_figures(rows, "cpu", "step_cpu"))
    )
    return wall, main, cpu


def _cpu(rows: list[dict]) -> float:
    """Median CPU seconds (all threads) of the compile to its first result: under load, when
    wall times mostly measure waiting, the steadier figure (bench output of older trees: nan)."""
    return statistics.median(r.get("cpu", float("nan")) for r in rows)


def phases_text(rows: list[dict]) -> str:
    names = [
        p
        for p in ("import", "trace", "adjoint", "rules", "optimize", "plan", "kernels")
        if p in rows[0]["phases"]
    ]
    return ", ".join(
        f"{p} {statistics.median(r['phases'].get(p, 0.0) for r in rows) * 1e3:.0f}" for p in names
    )


def _warm_log(warm: dict | None) -> str:
    if warm is None:
        return ""
    step = warm.get("step")
    return f", warm {warm['seconds']:.3f} s (a steady step {step if step is not None else float('nan'):.3f} s)"


def run(
    trees: list[Path],
    rounds: int,
    timeout: float,
    depths,
    peers,
    log=print,
    steady=5,
    programs=PROGRAMS,
):
    results: dict[tuple, list] = {}
    for tree in trees:  # writes the bytecode caches; not measured
        cold_and_warm(tree, "tanh8", timeout)
    for framework in peers:
        peer(framework, "tanh8", timeout)
    for r in range(rounds):
        for program in programs:
            order = trees if r % 2 == 0 else trees[::-1]
            for tree in order:
                cold, warm = cold_and_warm(tree, program, timeout, steady)
                results.setdefault((program, str(tree)), []).append((cold, warm))
                log(f"round {r} {program} {tree}: cold {cold['seconds']:.2f} s{_warm_log(warm)}")
            for framework in peers:
                j, jw = peer(framework, program, timeout, steady)
                results.setdefault((program, framework), []).append((j, jw))
                log(f"round {r} {program} {framework}: cold {j['seconds']:.2f} s{_warm_log(jw)}")
    growth = []
    for i, n in enumerate(depths):  # every tree at every depth, taking turns
        for tree in trees if i % 2 == 0 else trees[::-1]:
            cold, _ = cold_and_warm(tree, f"tanh{n}", timeout)
            growth.append((n, tree, cold, {}))
            log(f"tanh chain {n} {tree}: {cold['seconds']:.2f} s, CPU {cold['cpu']:.2f} s")
        others = {framework: peer(framework, f"tanh{n}", timeout)[0] for framework in peers}
        growth[-1] = growth[-1][:3] + (others,)
        log("".join(f"tanh chain {n} {f} {o['seconds']:.2f} s" for f, o in others.items()))
    return results, growth


TITLES = {
    "mlp": "MLP step",
    "cnn": "CNN step",
    "transformer": "transformer step",
    "tanh30": "tanh chain 30",
}


def report(results, growth, trees: list[Path], peers, profile: bool) -> str:
    labels = {str(t): (f"`{t}`" if len(trees) > 1 else "dlvm_eq") for t in trees}
    if len(trees) == 2:
        labels = {str(trees[0]): "dlvm_eq before", str(trees[1]): "dlvm_eq after"}
    head = (
        "| program | compiler | cold s | CPU s cold | warm s: first result / steady step / "
        "overhead | warm main-thread CPU ms: first / step / overhead | warm process CPU ms: "
        "first / step / overhead | peak RSS MB (cold) |"
    )
    if profile:
        head += " cold by phase (ms) |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for program in PROGRAMS:
        if (program, str(trees[0])) not in results:  # --rounds 0: the growth table only
            continue
        for tree in trees:
            rows = results[(program, str(tree))]
            colds, warms = [c for c, _ in rows], [w for _, w in rows]
            line = (
                f"| {TITLES[program]} | {labels[str(tree)]} | {median(colds, 'seconds'):.2f} | "
                f"{_cpu(colds):.2f} | {' | '.join(warm_text(warms))} | "
                f"{median(colds, 'rss_mb'):.0f} |"
            )
            if profile:
                line += f" {phases_text(colds)} |"
            lines.append(line)
        for framework in peers:
            rows = [j for j, _ in results[(program, framework)]]
            warms = [w for _, w in results[(program, framework)] if w is not None]
            cells = warm_text(warms) if warms else ("", "", "")
            line = (
                f"| {TITLES[program]} | {PEERS[framework][1]} | {median(rows, 'seconds'):.2f} | "
                f"{_cpu(rows):.2f} | {' | '.join(cells)} | {median(rows, 'rss_mb'):.0f} |"
            )
            lines.append(line + (" |" if profile else ""))
    out = ["\n".join(lines)] if len(lines) > 2 else []
    if len(trees) > 1:  # a change of compile time must not change the programs
        same = []
        for program in PROGRAMS:
            if (program, str(trees[0])) in results:
                plans = {
                    r[k]["plan"] for t in trees for r in results[(program, str(t))] for k in (0, 1)
                }
                same.append(f"{TITLES[program]} {'identical' if len(plans) == 1 else 'DIFFERENT'}")
        if same:
            out.append(
                "Printed plans across trees, rounds, cold and warm: " + ", ".join(same) + "."
            )
    if growth:
        names = [PEERS[f][1] for f in peers]
        g = [
            "| depth | compiler | cold s | CPU s | CPU ms per layer | "
            + "".join(f"{n} cold s | " for n in names)
            + "by phase (wall ms) | plan |",
            "|---|---|---|---|---|" + "---|" * len(names) + "---|---|",
        ]
        plans: dict[int, set] = {}
        for n, tree, cold, others in sorted(growth, key=lambda r: (r[0], str(r[1]))):
            plans.setdefault(n, set()).add(cold.get("plan"))
            kernels = re.search(r"(\d+) kernels?", cold.get("plan") or "")
            g.append(
                f"| {n} | {labels[str(tree)]} | {cold['seconds']:.2f} | {_cpu([cold]):.2f} | "
                f"{_cpu([cold]) / n * 1e3:.1f} | "
                + "".join(f"{others[f]['seconds']:.2f} | " if f in others else "| " for f in peers)
                + f"{phases_text([cold])} | {kernels.group(0) if kernels else '?'} |"
            )
        out.append("tanh-chain gradient, cold, by depth:\n\n" + "\n".join(g))
        if len(trees) > 1:
            out.append(
                "Printed plans across trees, by depth: "
                + ", ".join(
                    f"{n} {'identical' if len(p) == 1 else 'DIFFERENT'}" for n, p in plans.items()
                )
                + "."
            )
    return "\n\n".join(out)


def machine() -> str:
    sys.path.insert(0, str(HERE))
    from common import machine_line

    return machine_line()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", type=Path, default=[ROOT], help="source trees to compare")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--programs", nargs="+", choices=PROGRAMS, default=list(PROGRAMS))
    ap.add_argument(
        "--steady", type=int, default=5, help="steady steps timed in each warm process (median)"
    )
    ap.add_argument("--depths", type=int, nargs="*", default=list(DEPTHS))
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--profile", action="store_true", help="each cold compile's time by phase")
    ap.add_argument("--update", type=Path, help="write the section into this markdown file")
    args = ap.parse_args(argv)
    trees = [t.resolve() for t in args.trees]
    peers = installed_peers(
        [n for n, off in (("jax", args.no_jax), ("torch", args.no_torch)) if not off]
    )
    results, growth = run(
        trees,
        args.rounds,
        args.timeout,
        args.depths,
        peers,
        log=lambda s: print(s, file=sys.stderr, flush=True),
        steady=args.steady,
        programs=args.programs,
    )
    text = report(results, growth, trees, peers, args.profile)
    cmd = "benchmarks/compile_time.py " + " ".join(argv if argv is not None else sys.argv[1:])
    section = (
        f"{SECTION}\n\n`{cmd.strip()}`, {datetime.date.today()}, {machine()}; medians of "
        f"{args.rounds} rounds, each compile a fresh process (import not counted), cold with an "
        f"empty cache, warm on the cache the cold one filled (JAX: its persistent compilation "
        f"cache), a steady step the median of {args.steady} further calls in the warm process; "
        f"peers: "
        f"{', '.join(PEERS[f][1] for f in peers) or 'none installed'}.\n\n" + text
    )
    print(section)
    if args.update:
        sys.path.insert(0, str(HERE))
        from common import update_section

        update_section(args.update, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
