"""A GRU's (or LSTM's) value and gradient over T steps: dq.scan (the body compiled once, run
on the native loop driver), the same GRU unrolled by a Python loop (the only way before scan),
JAX's lax.scan, and PyTorch (an eager loop of the same cell, and nn.GRU / nn.LSTM), in one
run. Cold compile time (a fresh process and an empty compile cache per row; PyTorch: its
first call), step time (median of timed calls) and peak memory (the fresh process's peak RSS
growth from before the first call), batch 16, input 32, hidden 64 (`--hidden`), float32.

    python benchmarks/rnn.py                       # prints the tables
    python benchmarks/rnn.py --update BENCHMARKS.md
    python benchmarks/rnn.py --steps 8 64 --unrolled-max 64 --cell lstm --hidden 256
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # this tree's dlvm_eq, not an installed one
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
from common import machine_line, markdown_table, median_time, update_section  # noqa: E402

BATCH, INPUT, HIDDEN = 16, 32, 64
HEADING = "## RNN: GRU value and gradient through dq.scan"
GATES = {"gru": "zrh", "lstm": "ifoc"}
KINDS = ("dq-scan", "dq-unrolled", "jax", "torch-loop", "torch-nn")
# PyTorch on one thread: with its default two OpenMP threads on this loaded 2-core machine a
# T = 64 GRU step took 1.7-1.9 s against 53-69 ms on one (the threads spin against the load)
TORCH_THREADS = 1


def _data(steps: int, cell: str = "gru", hidden: int = HIDDEN):
    import numpy as np

    rng = np.random.default_rng(0)
    p = {}
    for g in GATES[cell]:
        p[f"w{g}"] = (rng.standard_normal((INPUT, hidden)) * 0.2).astype(np.float32)
        p[f"u{g}"] = (rng.standard_normal((hidden, hidden)) * 0.2).astype(np.float32)
    h0 = np.zeros((BATCH, hidden), np.float32)
    xs = rng.standard_normal((steps, BATCH, INPUT)).astype(np.float32)
    return p, h0, xs


def _cell(np_, sigmoid, p, h, x):
    """The GRU cell (Cho et al.), the same formula for dq, JAX, numpy and PyTorch tensors."""
    z = sigmoid(x @ p["wz"] + h @ p["uz"])
    r = sigmoid(x @ p["wr"] + h @ p["ur"])
    c = np_.tanh(x @ p["wh"] + (r * h) @ p["uh"])
    return (1.0 - z) * h + z * c


def _lstm(np_, sigmoid, p, hc, x):
    """The LSTM cell on the carry (h, c); h is what the loss reads."""
    h, c = hc
    i = sigmoid(x @ p["wi"] + h @ p["ui"])
    f = sigmoid(x @ p["wf"] + h @ p["uf"])
    o = sigmoid(x @ p["wo"] + h @ p["uo"])
    c = f * c + i * np_.tanh(x @ p["wc"] + h @ p["uc"])
    return o * np_.tanh(c), c


def _step(np_, sigmoid, cell):
    """(carry, x) -> (carry, h) for lax.scan / dq.scan; the carry of an LSTM is (h, c)."""
    if cell == "gru":
        return lambda p: lambda h, x: (lambda h: (h, h))(_cell(np_, sigmoid, p, h, x))

    def lstm(p):
        def step(hc, x):
            hc = _lstm(np_, sigmoid, p, hc, x)
            return hc, hc[0]

        return step

    return lstm


def _init(cell, h0):
    return h0 if cell == "gru" else (h0, h0 * 0.0)


def _dq_program(kind: str, cell: str = "gru"):
    import dlvm_eq as dq

    step = _step(dq, dq.sigmoid, cell)
    if kind == "dq-scan":

        def loss(p, h0, xs):
            _, ys = dq.scan(step(p), _init(cell, h0), xs)
            return dq.mean(ys * ys)

    else:

        def loss(p, h0, xs):
            carry, total = _init(cell, h0), 0.0
            for t in range(xs.shape[0]):
                carry, h = step(p)(carry, xs[t])
                total = total + dq.sum(h * h)
            return total / (xs.shape[0] * BATCH * h0.shape[1])

    return dq.jit(dq.value_and_grad(loss))


def _jax_program(cell: str = "gru"):
    import jax
    import jax.numpy as jnp

    step = _step(jnp, jax.nn.sigmoid, cell)

    def loss(p, h0, xs):
        _, ys = jax.lax.scan(step(p), _init(cell, h0), xs)
        return jnp.mean(ys * ys)

    return jax.jit(jax.value_and_grad(loss))


def _torch_program(kind: str, cell: str, args):
    """(a callable running value and gradient, its arguments): `torch-loop` the same cell in an
    eager Python loop, `torch-nn` nn.GRU / nn.LSTM (PyTorch's own formula, the same sizes)."""
    import torch

    p, h0, xs = args
    xs_t, h0_t = torch.from_numpy(xs), torch.from_numpy(h0)
    if kind == "torch-nn":
        hidden = h0.shape[1]
        net = (torch.nn.GRU if cell == "gru" else torch.nn.LSTM)(INPUT, hidden, bias=False)

        def run():
            net.zero_grad(set_to_none=True)
            ys, _ = net(xs_t)
            loss = torch.mean(ys * ys)
            loss.backward()
            return loss.item(), [q.grad for q in net.parameters()]

        return run
    params = {k: torch.from_numpy(v).requires_grad_() for k, v in p.items()}
    step = _step(torch, torch.sigmoid, cell)(params)

    def run():
        for q in params.values():
            q.grad = None
        carry, ys = _init(cell, h0_t), []
        for t in range(xs_t.shape[0]):
            carry, h = step(carry, xs_t[t])
            ys.append(h)
        ys = torch.stack(ys)
        loss = torch.mean(ys * ys)
        loss.backward()
        return loss.item(), [q.grad for q in params.values()]

    return run


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_one(kind: str, steps: int, repeats: int, cell: str = "gru", hidden: int = HIDDEN) -> dict:
    """Compile (first call), step time and peak memory of one program, in this process."""
    args = _data(steps, cell, hidden)
    sync = None
    if kind == "jax":  # imports are not compile time (dlvm_eq's code generator and e-graph
        import jax  # still load on first use: that is part of a cold compile)

        jax.numpy.zeros(1).block_until_ready()
        sync = lambda out: out[0].block_until_ready()
    elif kind.startswith("torch"):
        import torch

        torch.set_num_threads(TORCH_THREADS)
    else:
        import dlvm_eq  # noqa: F401
    rss0 = _rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    if kind == "jax":
        f = _jax_program(cell)
    elif kind.startswith("torch"):
        run = _torch_program(kind, cell, args)
        f = lambda *_: run()
    else:
        f = _dq_program(kind, cell)
    out = f(*args)
    if sync:
        sync(out)
    compile_s, compile_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    step = median_time(lambda: f(*args), repeats=repeats, warmup=2, sync=sync)
    cpu = []  # CPU seconds of the process (every thread) per call: what load does not inflate
    for _ in range(max(3, repeats // 2)):
        c0 = time.process_time()
        out = f(*args)
        if sync:
            sync(out)
        cpu.append(time.process_time() - c0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
    return {
        "kind": kind,
        "steps": steps,
        "compile_s": compile_s,
        "compile_cpu_s": compile_cpu_s,
        "step_ms": step.ms,
        "cpu_ms": 1e3 * sorted(cpu)[len(cpu) // 2],
        "peak_mb": max(peak - rss0, 0.0),
    }


def _switch(name: str, on: bool) -> None:
    """Turn a code-generation choice off or on (before compiling: it is read then)."""
    if name == "residuals":
        from dlvm_eq.ad import scan_residuals as sr

        sr.STORE_UNTRANSPOSED = sr.RECOMPUTE_CHEAP = on
    else:  # "prepack": a loop's products with a loop-invariant weight packed once per call
        from dlvm_eq.codegen.execution import packed_products

        packed_products.PREPACK = on


def choice_off_on(steps: int, cell: str, hidden: int, switch: str, rounds: int = 40) -> str:
    """CPU ms a call with a choice (`_switch`) off and on, and nn.LSTM / nn.GRU on one thread,
    in one process, calls alternated (each compiled once, the same arguments)."""
    import numpy as np

    args = _data(steps, cell, hidden)
    progs = []
    for on in (False, True):
        _switch(switch, on)
        progs.append(_dq_program("dq-scan", cell))
        progs[-1](*args)
    _switch(switch, True)
    if _has("torch"):
        import torch

        torch.set_num_threads(TORCH_THREADS)
        run = _torch_program("torch-nn", cell, args)
        progs.append(lambda *_: run())
    times: list[list[float]] = [[] for _ in progs]
    for _ in range(rounds):
        for f, acc in zip(progs, times):
            c0 = time.process_time()
            f(*args)
            acc.append(time.process_time() - c0)
    ms = [1e3 * float(np.median(t)) for t in times]
    torch_ms = f", nn.{cell.upper()} {ms[2]:.2f} ms" if len(ms) > 2 else ""
    return (
        f"{cell} {hidden} T={steps}: {switch} off {ms[0]:.2f} ms, on {ms[1]:.2f} ms CPU a call "
        f"({ms[1] / ms[0]:.3f}x){torch_ms}"
    )


def compile_bytecode() -> None:
    """Write this tree's bytecode (dlvm_eq/**/__pycache__, ignored by git) before the rows: an
    installed package has it (pip compiles it; JAX's and PyTorch's have theirs), and without
    it a fresh process compiles the source of every module a cold compile loads (with
    PYTHONDONTWRITEBYTECODE set, as on the development machines, in every process)."""
    import compileall

    compileall.compile_dir(str(ROOT / "dlvm_eq"), quiet=1)


def remove_bytecode() -> None:
    """Delete this tree's dlvm_eq bytecode (for --no-bytecode: a fresh process then compiles
    every dlvm_eq module it loads from source, as rows measured before session 17 did)."""
    import shutil

    for d in sorted((ROOT / "dlvm_eq").rglob("__pycache__")):
        shutil.rmtree(d, ignore_errors=True)


def _in_fresh_process(
    kind: str, steps: int, repeats: int, cell: str, hidden: int, bytecode: bool = True
) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env = dict(os.environ, DLVM_EQ_CACHE_DIR=cache, PYTHONPATH=path)
        if bytecode:  # (common.child_json does the same for compile_time.py)
            env.pop("PYTHONDONTWRITEBYTECODE", None)
        else:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        cmd = [sys.executable, __file__, "--one", kind, str(steps), "--repeats", str(repeats)]
        cmd += ["--cell", cell, "--hidden", str(hidden)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{kind} T={steps} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _has_jax() -> bool:
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[8, 64, 512, 2048])
    ap.add_argument("--unrolled-max", type=int, default=8, help="longest unrolled program")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--cell", choices=sorted(GATES), default="gru")
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--table-only", action="store_true", help="no overhead, SGD or memory runs")
    ap.add_argument(
        "--choice",
        choices=["residuals", "prepack"],
        help="CPU time with a choice off and on (the scan residuals' storage; packed weights)",
    )
    ap.add_argument("--overhead-only", action="store_true", help="print the drivers' overheads")
    ap.add_argument("--update", type=Path, help="write the table into this markdown file")
    ap.add_argument(
        "--programs", nargs="+", choices=KINDS, help="only these rows (default: every one)"
    )
    ap.add_argument(
        "--no-bytecode",
        action="store_true",
        help="delete dlvm_eq's bytecode first: fresh processes compile its source as they load it "
        "(as runs before session 17 did)",
    )
    ap.add_argument("--one", nargs=2, metavar=("KIND", "T"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one[0], int(a.one[1]), a.repeats, a.cell, a.hidden)))
        return
    load = os.getloadavg()[0]
    if a.choice:
        for steps in a.steps:
            got = choice_off_on(steps, a.cell, a.hidden, a.choice)
            print(f"load {os.getloadavg()[0]:.1f}", got)
        return
    if a.overhead_only:
        from rnn_drivers import large_bodies, overhead

        print(f"load {load:.2f}", overhead(), f"load {os.getloadavg()[0]:.2f}")
        head = ["carry", "native, swapped us/step", "native, copied", "Python driver", "load"]
        print(markdown_table(head, large_bodies()))
        return
    kinds = ["dq-scan", "dq-unrolled"] + (["jax"] if _has("jax") else [])
    kinds += ["torch-loop", "torch-nn"] if _has("torch") else []
    kinds = [k for k in kinds if k in (a.programs or kinds)]
    if a.no_bytecode:
        remove_bytecode()
    else:
        compile_bytecode()
    rows = []
    for steps in a.steps:
        for kind in kinds:
            if kind == "dq-unrolled" and steps > a.unrolled_max:
                continue
            r = _in_fresh_process(kind, steps, a.repeats, a.cell, a.hidden, not a.no_bytecode)
            rows.append(
                [
                    steps,
                    kind,
                    f"{r['compile_s']:.2f}",
                    f"{r['compile_cpu_s']:.2f}",
                    f"{r['step_ms']:.3f}",
                    f"{r['cpu_ms']:.3f}",
                    f"{r['peak_mb']:.0f}",
                    f"{os.getloadavg()[0]:.1f}",
                ]
            )
            print(f"T={steps} {kind}: {r}", flush=True)
    table = markdown_table(
        [
            "T",
            "program",
            "cold compile s (torch: first call)",
            "cold compile CPU s",
            "step ms (median)",
            "step CPU ms (median)",
            "peak RSS growth MB",
            "load",
        ],
        rows,
    )
    default = (a.cell, a.hidden) == ("gru", HIDDEN)
    heading = (
        HEADING
        if default
        else f"## RNN: {a.cell.upper()} (hidden {a.hidden}) value and gradient through dq.scan"
    )
    command = " ".join(["python benchmarks/rnn.py", *sys.argv[1:]])
    text = (
        f"{heading}\n\n"
        f"Command: `{command}`  \n"
        f"Machine: {machine_line()}; measured {time.strftime('%Y-%m-%d')}, load average "
        f"{load:.2f} before the run and per row in the table (a shared machine).\n\n"
        f"{a.cell.upper()} (batch {BATCH}, input {INPUT}, hidden {a.hidden}, float32, no "
        "biases), value and gradient of the mean squared hidden states with respect to the "
        "weight matrices, target cpu. Cold compile: the first call in a fresh process with "
        "an empty compile cache (trace, differentiate, optimize, plan, kernels; PyTorch has "
        "nothing to compile: its first call; "
        + (
            "dlvm_eq's modules compiled from source as they load, no bytecode"
            if a.no_bytecode
            else "every package's modules loaded from bytecode, as installed"
        )
        + "; CPU: the process's CPU seconds, all threads); step: median wall time of the timed "
        "calls after "
        "it; step CPU: median CPU time of the process (all its threads) per call, which the "
        "machine's load inflates far less than wall time (a call that needs a few ms of CPU "
        "is often preempted here and waits a time slice); peak "
        "RSS growth: the process's peak RSS less its RSS after imports. `dq-scan` compiles "
        "each straight piece and the forward and backward scan bodies once and runs both "
        "scans on the native loop driver; `dq-unrolled` is the Python loop unrolled at trace "
        f"time (not run past T = {a.unrolled_max}); `jax` is `jax.lax.scan` under `jax.jit`; "
        "`torch-loop` the same cell in an eager Python loop with autograd; `torch-nn` "
        f"`nn.{'GRU' if a.cell == 'gru' else 'LSTM'}` (PyTorch's own gate formula, the same "
        f"sizes), on {TORCH_THREADS} thread (with its default two threads under this load a "
        "T = 64 step took 25-35x longer); dlvm_eq, JAX and OpenBLAS with their defaults.\n\n"
        f"{table}\n"
    )
    if not a.table_only:
        from rnn_drivers import overhead, residual_memory, sgd_in_one_call

        o = overhead()
        print(o)
        sgd = sgd_in_one_call()
        print(sgd)
        memory = markdown_table(
            ["T", "T carries KiB", "peak KiB, checkpoint None", 'peak KiB, checkpoint "sqrt"'],
            residual_memory(),
        )
        print(memory)
        text += (
            f"\nPer-iteration overhead of the loop drivers (load {os.getloadavg()[0]:.1f}): a "
            f"scan of {o['steps']} steps whose body is one add on a {BATCH} x {HIDDEN} f32 "
            f"carry takes {o['native_us']:.2f} us a step on the native driver (every step in "
            "native code, the carry and the body's result swapped between two buffers; "
            f"{o['native_copy_us']:.2f} us with the result copied into the carry each step, "
            "`native_loop.SWAP_CARRIES = False`) and "
            f"{o['python_us']:.1f} us a step on the Python driver "
            "(`pipeline/loops.NATIVE_LOOPS = False`: a Python call of the body per step). "
            f"A `dq.while_loop` of as many steps (a counter test, the same add) takes "
            f"{o['while_native_us']:.2f} us a step on the native driver (the test's kernel, "
            f"a break on its bool, the body) and {o['while_python_us']:.1f} us on the Python "
            "driver (two Python calls a step and the bool read back). A scan of "
            f"{o['steps'] // 10} steps whose body is a scan of 10 such steps takes "
            f"{o['nested_native_us']:.2f} us an inner step natively (the inner loop a record "
            "of the outer one) and "
            f"{o['nested_python_us']:.2f} us with the outer loop on the Python driver (the "
            "inner one native: before, a body with a loop of its own ran so). Alternating rounds in "
            "one process; the compiled body called alone from Python "
            f"takes {o['body_alone_us']:.1f} us a call.\n\n"
            f"Training inside one call: {sgd['steps']} SGD steps of a least-squares model "
            "(256 x 32, value-and-grad in the loop body) through `dq.fori_loop` in one "
            f"`dq.jit` call take {sgd['one_call_ms']:.2f} ms; {sgd['steps']} calls of the "
            f"jitted step take {sgd['separate_ms']:.2f} ms (ratio "
            f"{sgd['one_call_ms'] / sgd['separate_ms']:.2f}).\n\n"
            f"Residual memory: the gradient of a tanh RNN (carry {BATCH} x {HIDDEN} f32, 4 KiB) "
            "with respect to its weights, peak bytes allocated during one compiled call "
            "(tracemalloc, numpy arrays included, after two warm-up calls). Without "
            "checkpointing the forward scan stores each step's residuals (here two 4 KiB "
            "values: what the body's VJP reads that depends on the carry); "
            '`dq.scan(..., checkpoint="sqrt")` stores one carry per segment of ceil(sqrt(T)) '
            "steps and runs each segment again in the backward pass.\n\n"
            f"{memory}\n"
        )
    print(text)
    if a.update:
        update_section(a.update, heading, text)


if __name__ == "__main__":
    main()
