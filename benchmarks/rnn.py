"""A GRU's value and gradient over T steps: dq.scan (the body compiled once) against the same
GRU unrolled by a Python loop (the only way before scan), and JAX's lax.scan when JAX is
installed. Cold compile time (a fresh process and an empty compile cache per row) and step
time (median of timed calls), batch 16, input 32, hidden 64, float32.

    python benchmarks/rnn.py                       # prints the table
    python benchmarks/rnn.py --update BENCHMARKS.md
    python benchmarks/rnn.py --steps 8 64 --unrolled-max 64
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, markdown_table, median_time, update_section

BATCH, INPUT, HIDDEN = 16, 32, 64
HEADING = "## RNN: GRU value and gradient through dq.scan"


def _data(steps: int):
    import numpy as np

    rng = np.random.default_rng(0)
    p = {
        k: (rng.standard_normal(s) * 0.2).astype(np.float32)
        for k, s in [
            ("wz", (INPUT, HIDDEN)),
            ("uz", (HIDDEN, HIDDEN)),
            ("wr", (INPUT, HIDDEN)),
            ("ur", (HIDDEN, HIDDEN)),
            ("wh", (INPUT, HIDDEN)),
            ("uh", (HIDDEN, HIDDEN)),
        ]
    }
    h0 = np.zeros((BATCH, HIDDEN), np.float32)
    xs = rng.standard_normal((steps, BATCH, INPUT)).astype(np.float32)
    return p, h0, xs


def _cell(np_, sigmoid, p, h, x):
    z = sigmoid(x @ p["wz"] + h @ p["uz"])
    r = sigmoid(x @ p["wr"] + h @ p["ur"])
    c = np_.tanh(x @ p["wh"] + (r * h) @ p["uh"])
    return (1.0 - z) * h + z * c


def _dq_program(kind: str):
    import dlvm_eq as dq

    def cell(p, h, x):
        return _cell(dq, dq.sigmoid, p, h, x)

    if kind == "dq-scan":

        def loss(p, h0, xs):
            h, ys = dq.scan(lambda h, x: (cell(p, h, x),) * 2, h0, xs)
            return dq.mean(ys * ys)

    else:

        def loss(p, h0, xs):
            h, total = h0, 0.0
            for t in range(xs.shape[0]):
                h = cell(p, h, xs[t])
                total = total + dq.sum(h * h)
            return total / (xs.shape[0] * BATCH * HIDDEN)

    return dq.jit(dq.value_and_grad(loss))


def _jax_program():
    import jax
    import jax.numpy as jnp

    def loss(p, h0, xs):
        def step(h, x):
            h = _cell(jnp, jax.nn.sigmoid, p, h, x)
            return h, h

        h, ys = jax.lax.scan(step, h0, xs)
        return jnp.mean(ys * ys)

    return jax.jit(jax.value_and_grad(loss))


def run_one(kind: str, steps: int, repeats: int) -> dict:
    """Compile (first call) and step time of one program, in this process."""
    args = _data(steps)
    if kind == "jax":  # imports are not compile time (dlvm_eq's code generator and e-graph
        import jax  # noqa: F401  # still load on first use: that is part of a cold compile)
    else:
        import dlvm_eq  # noqa: F401
    t0 = time.perf_counter()
    if kind == "jax":
        f = _jax_program()
        sync = lambda out: out[0].block_until_ready()
    else:
        f = _dq_program(kind)
        sync = None
    out = f(*args)
    if sync:
        sync(out)
    compile_s = time.perf_counter() - t0
    step = median_time(lambda: f(*args), repeats=repeats, warmup=2, sync=sync)
    return {"kind": kind, "steps": steps, "compile_s": compile_s, "step_ms": step.ms}


def overhead(steps: int = 1000, repeats: int = 10) -> dict:
    """Per-step cost of the loop driver: a scan whose body is one add on a 16 x 64 carry,
    against calling that body's compiled program directly (numpy arrays, target cpu)."""
    import numpy as np

    import dlvm_eq as dq
    from dlvm_eq.ir import Module

    c0 = np.zeros((BATCH, HIDDEN), np.float32)
    xs = np.ones((steps, BATCH, HIDDEN), np.float32)
    f = dq.jit(lambda c, xs: dq.scan(lambda c, x: (c + x, None), c0 * 0.0 + c, xs)[0])
    f(c0, xs)
    per_step = median_time(lambda: f(c0, xs), repeats=repeats, warmup=1).median / steps
    m = dq.make_ir(lambda c, x: c + x)(c0, xs[0])
    body = dq.compile(Module("b", functions=dict(m.functions)), next(iter(m.functions)))
    alone = median_time(lambda: body(c0, xs[0]), repeats=2000, warmup=50).median
    return {"per_step_us": per_step * 1e6, "body_alone_us": alone * 1e6, "steps": steps}


def sgd_in_one_call(steps: int = 100, repeats: int = 7) -> dict:
    """`steps` SGD steps of a least-squares model (256 x 32) inside one dq.jit call through
    dq.fori_loop, against `steps` calls of the jitted step (medians, seconds)."""
    import numpy as np

    import dlvm_eq as dq

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 32)).astype(np.float32)
    y = (x @ rng.standard_normal((32, 1))).astype(np.float32)
    w0 = np.zeros((32, 1), np.float32)
    g = dq.grad(lambda w, x, y: dq.mean(dq.square(x @ w - y)))
    one = dq.jit(lambda w, x, y: w - 0.05 * g(w, x, y))
    many = dq.jit(lambda w, x, y: dq.fori_loop(0, steps, lambda i, w: w - 0.05 * g(w, x, y), w))

    def separate():
        w = w0
        for _ in range(steps):
            w = one(w, x, y)
        return w

    a = median_time(lambda: many(w0, x, y), repeats=repeats, warmup=1).median
    b = median_time(separate, repeats=repeats, warmup=1).median
    return {"steps": steps, "one_call_ms": a * 1e3, "separate_ms": b * 1e3}


def residual_memory(steps_list=(64, 256, 1024)) -> list[list]:
    """Peak bytes allocated (tracemalloc: numpy's arrays included) by one compiled call of a
    tanh RNN's gradient with respect to its weights, checkpoint None against "sqrt"."""
    import tracemalloc

    import numpy as np

    import dlvm_eq as dq

    rows = []
    for steps in steps_list:
        rng = np.random.default_rng(0)
        w = (rng.standard_normal((HIDDEN, HIDDEN)) * 0.1).astype(np.float32)
        h0 = np.zeros((BATCH, HIDDEN), np.float32)
        xs = rng.standard_normal((steps, BATCH, HIDDEN)).astype(np.float32)
        row = [steps, f"{steps * h0.nbytes / 1024:.0f}"]
        for ck in (None, "sqrt"):

            def loss(w, h0, xs, ck=ck):
                step = lambda h, x: (dq.tanh(h @ w + x), None)
                return dq.mean(dq.square(dq.scan(step, h0, xs, checkpoint=ck)[0]))

            g = dq.jit(dq.grad(loss))
            g(w, h0, xs)
            g(w, h0, xs)  # buffers the executor keeps between calls are not counted
            tracemalloc.start()
            g(w, h0, xs)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            row.append(f"{peak / 1024:.0f}")
        rows.append(row)
    return rows


def _in_fresh_process(kind: str, steps: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, DLVM_EQ_CACHE_DIR=cache)
        cmd = [sys.executable, __file__, "--one", kind, str(steps), "--repeats", str(repeats)]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[8, 64, 512])
    ap.add_argument("--unrolled-max", type=int, default=64, help="longest unrolled program")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--update", type=Path, help="write the table into this markdown file")
    ap.add_argument("--one", nargs=2, metavar=("KIND", "T"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one[0], int(a.one[1]), a.repeats)))
        return
    kinds = ["dq-scan", "dq-unrolled"] + (["jax"] if _has_jax() else [])
    rows = []
    for steps in a.steps:
        for kind in kinds:
            if kind == "dq-unrolled" and steps > a.unrolled_max:
                rows.append([steps, kind, None, None])
                continue
            r = _in_fresh_process(kind, steps, a.repeats)
            rows.append([steps, kind, f"{r['compile_s']:.2f}", f"{r['step_ms']:.3f}"])
            print(f"T={steps} {kind}: compile {r['compile_s']:.2f} s, step {r['step_ms']:.3f} ms")
    table = markdown_table(["T", "program", "cold compile s", "step ms (median)"], rows)
    o = overhead()
    print(o)
    sgd = sgd_in_one_call()
    print(sgd)
    memory = markdown_table(
        ["T", "T carries KiB", "peak KiB, checkpoint None", 'peak KiB, checkpoint "sqrt"'],
        residual_memory(),
    )
    print(memory)
    text = (
        f"{HEADING}\n\n"
        f"Command: `python benchmarks/rnn.py{' --update ' + str(a.update) if a.update else ''}`  \n"
        f"Machine: {machine_line()}; measured {time.strftime('%Y-%m-%d')}, load average "
        f"{os.getloadavg()[0]:.2f} before the run (a shared machine).\n\n"
        f"GRU (batch {BATCH}, input {INPUT}, hidden {HIDDEN}, float32), value and gradient of "
        "the mean squared hidden state with respect to the six weight matrices, target cpu. "
        "Cold compile: the first call in a fresh process with an empty compile cache (trace, "
        "differentiate, optimize, plan, kernels); step: median of the timed calls after it. "
        "`dq-scan` compiles each straight piece and the forward and backward scan bodies once; "
        "`dq-unrolled` is the Python loop unrolled at trace time (not run past "
        f"T = {a.unrolled_max}).\n\n{table}\n\n"
        f"Per-iteration overhead of the loop driver: a scan of {o['steps']} steps whose body "
        f"is one add on a {BATCH} x {HIDDEN} f32 carry takes {o['per_step_us']:.1f} us a "
        f"step; the compiled body called alone from Python takes {o['body_alone_us']:.1f} us "
        "a call (the driver adds the rest: slicing xs, stacking ys, Python between steps).\n\n"
        f"Training inside one call: {sgd['steps']} SGD steps of a least-squares model "
        "(256 x 32, value-and-grad in the loop body) through `dq.fori_loop` in one `dq.jit` "
        f"call take {sgd['one_call_ms']:.2f} ms; {sgd['steps']} calls of the jitted step "
        f"take {sgd['separate_ms']:.2f} ms (ratio "
        f"{sgd['one_call_ms'] / sgd['separate_ms']:.2f}).\n\n"
        f"Residual memory: the gradient of a tanh RNN (carry {BATCH} x {HIDDEN} f32, 4 KiB) "
        "with respect to its weights, peak bytes allocated during one compiled call "
        "(tracemalloc, numpy arrays included, after two warm-up calls). Without "
        "checkpointing the forward scan stores each step's residuals (here two 4 KiB values: "
        "what the body's VJP reads that depends on the carry); "
        '`dq.scan(..., checkpoint="sqrt")` stores one carry per segment of ceil(sqrt(T)) '
        "steps and runs each segment again in the backward pass.\n\n"
        f"{memory}\n"
    )
    print(text)
    if a.update:
        update_section(a.update, HEADING, text)


if __name__ == "__main__":
    main()
