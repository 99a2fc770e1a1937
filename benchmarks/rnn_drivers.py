"""The loop drivers' per-step overhead, training in one call, and a scan's residual memory:
the extra measurements of benchmarks/rnn.py (which prints them unless `--table-only`).

    python benchmarks/rnn.py --overhead-only     # overhead() and large_bodies()
"""

from __future__ import annotations

import os

from common import median_time

BATCH, HIDDEN = 16, 64  # benchmarks/rnn.py's sizes


def overhead(steps: int = 1000, rounds: int = 5) -> dict:
    """Per-step cost of the loop drivers, alternating rounds in this process: a scan whose body
    is one add on a 16 x 64 carry on the native driver (its carry swapped between two buffers,
    and copied each step), on the Python driver (pipeline/loops.NATIVE_LOOPS off); a while
    loop of as many steps (a counter test, the same add) on both drivers; a scan of scans of 10
    steps each (the outer loop on either driver); against calling the scan body's compiled
    program directly."""
    import numpy as np

    import dlvm_eq as dq
    from dlvm_eq.codegen.execution import native_loop
    from dlvm_eq.ir import Module
    from dlvm_eq.pipeline import loops

    c0 = np.zeros((BATCH, HIDDEN), np.float32)
    xs = np.ones((steps, BATCH, HIDDEN), np.float32)
    n = np.int32(steps)

    def scan(c, xs):
        return dq.scan(lambda c, x: (c + x, None), c0 * 0.0 + c, xs)[0]

    def while_loop(c, x, n):
        def body(k):
            return k[0] + 1, k[1] + x

        return dq.while_loop(lambda k: k[0] < n, body, (n * 0, c0 * 0.0 + c))[1]

    def nested(c, xss):  # steps // 10 outer steps, each a scan of 10 steps
        def outer(c, xs):
            return dq.scan(lambda c, x: (c + x, None), c, xs)[0], None

        return dq.scan(outer, c0 * 0.0 + c, xss)[0]

    xss = xs.reshape(steps // 10, 10, BATCH, HIDDEN)
    variants = {  # name: (native, swap, function, arguments)
        "native": (True, True, scan, (c0, xs)),
        "native_copy": (True, False, scan, (c0, xs)),
        "python": (False, True, scan, (c0, xs)),
        "while_native": (True, True, while_loop, (c0, xs[0], n)),
        "while_python": (False, True, while_loop, (c0, xs[0], n)),
        "nested_native": (True, True, nested, (c0, xss)),
        "nested_python": (False, True, nested, (c0, xss)),
    }
    fs = {}
    for name, (native, swap, f, args) in variants.items():
        loops.NATIVE_LOOPS, native_loop.SWAP_CARRIES = native, swap
        fs[name] = dq.jit(lambda *a, f=f: f(*a))
        fs[name](*args)
    loops.NATIVE_LOOPS, native_loop.SWAP_CARRIES = True, True
    times: dict = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (_, _, _, args) in variants.items():
            t = median_time(lambda f=fs[name], a=args: f(*a), repeats=5, warmup=1).median
            times[name].append(t / steps)
    m = dq.make_ir(lambda c, x: c + x)(c0, xs[0])
    body = dq.compile(Module("b", functions=dict(m.functions)), next(iter(m.functions)))
    alone = median_time(lambda: body(c0, xs[0]), repeats=2000, warmup=50).median
    out = {f"{name}_us": float(np.median(t)) * 1e6 for name, t in times.items()}
    return {**out, "body_alone_us": alone * 1e6, "steps": steps}


def large_bodies(rounds: int = 5) -> list[list]:
    """Per-step time of a scan `c = tanh(c * 0.5 + x)` with larger carries, alternating rounds:
    on the native driver with the carry swapped between two buffers and copied each step, and on
    the Python driver (whose plain calls split a kernel of 2**17 elements or more over threads;
    the native driver runs it as one call on its own thread)."""
    import numpy as np

    import dlvm_eq as dq
    from dlvm_eq.codegen.execution import native_loop
    from dlvm_eq.pipeline import loops

    rows = []
    for shape, steps in (((16, 64), 2000), ((256, 256), 200), ((1024, 256), 50)):
        c0 = np.zeros(shape, np.float32)
        xs = np.full((steps, *shape), 1e-3, np.float32)
        fs = {}
        for name, native, swap in (
            ("swap", True, True),
            ("copy", True, False),
            ("py", False, True),
        ):
            loops.NATIVE_LOOPS, native_loop.SWAP_CARRIES = native, swap
            fs[name] = dq.jit(
                lambda c, xs: dq.scan(lambda c, x: (dq.tanh(c * 0.5 + x), None), c, xs)[0]
            )
            fs[name](c0, xs)
        loops.NATIVE_LOOPS, native_loop.SWAP_CARRIES = True, True
        want = fs["py"](c0, xs)
        assert all(np.array_equal(f(c0, xs), want) for f in fs.values())  # the same bits
        times: dict = {name: [] for name in fs}
        for _ in range(rounds):
            for name, f in fs.items():
                t = median_time(lambda f=f: f(c0, xs), repeats=3, warmup=1).median
                times[name].append(t / steps * 1e6)
        med = {name: float(np.median(t)) for name, t in times.items()}
        rows.append(
            [
                " x ".join(map(str, shape)),
                f"{med['swap']:.2f}",
                f"{med['copy']:.2f}",
                f"{med['py']:.2f}",
                f"{os.getloadavg()[0]:.1f}",
            ]
        )
    return rows


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
