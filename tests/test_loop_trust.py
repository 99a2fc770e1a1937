"""Trust for compiled loops on the native driver: one compiled scan called from many threads at
once, beside a busy process, with a body hundreds of ops deep, with a long T, and processes that
leave while a loop runs (the main thread exits or gets SIGINT while another thread, or itself,
is inside a native loop). Results are checked against oracles that are not the driver (the
reference interpreter, numpy loops); every exit must be clean and bounded."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from at_once import run_at_once

import dlvm_eq as dq
from dlvm_eq.codegen.runtime.attention_cpu import openblas_libraries
from dlvm_eq.ir.interp import interpret
from dlvm_eq.pipeline.loops import compile_loops

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 120  # per process: a hang, not a slow machine


def _sigint_default():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def compiled(f, *args):
    m = dq.make_ir(f)(*args)
    name = next(iter(m.functions))
    prog = compile_loops(m, name, "cpu")
    assert prog.report.drivers and set(prog.report.drivers) == {"native"}, prog.report.drivers
    return prog, m, name


def gru_grad(w, u, h0, xs):
    def cell(h, x):
        z = dq.sigmoid(x @ w + h @ u)
        c = dq.tanh(x @ w - (z * h) @ u)
        h = (1.0 - z) * h + z * c
        return h, dq.sum(h * h, axis=1)

    h, ys = dq.scan(cell, h0, xs)
    return dq.sum(ys) + dq.mean(h)


def gru_args(seed, steps=12):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((6, 6)) * 0.4).astype(np.float32)
    u = (rng.standard_normal((6, 6)) * 0.4).astype(np.float32)
    h0 = (rng.standard_normal((5, 6)) * 0.2).astype(np.float32)
    xs = rng.standard_normal((steps, 5, 6)).astype(np.float32)
    return w, u, h0, xs


@pytest.fixture(scope="module")
def gru():
    return compiled(dq.value_and_grad(gru_grad, argnums=(0, 1)), *gru_args(0))


def test_one_compiled_scan_from_eight_threads_at_once(gru):
    prog, m, name = gru
    data = [gru_args(seed) for seed in range(8)]
    alone = [prog(*d) for d in data]  # one thread, one call at a time
    for d, got in zip(data, alone):
        want = interpret(m, name, *[a.astype(np.float64) for a in d])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-5)
    out: dict = {}
    threads_before = [get() for get, _ in openblas_libraries()]

    def work(i):
        for r in range(20):
            out[i, r] = prog(*data[(i + r) % 8])

    assert run_at_once(work, n=8) == []
    # loops run OpenBLAS on one thread while any is in flight; the last one puts it back
    assert [get() for get, _ in openblas_libraries()] == threads_before
    for (i, r), got in out.items():
        for g, w in zip(got, alone[(i + r) % 8]):
            np.testing.assert_array_equal(g, w)  # each call has its own arena and records


def test_nested_loops_and_a_while_loop_from_eight_threads_at_once():
    """A scan with a scan and a cond in its body, and a while loop, each compiled once and
    called from 8 threads at once: every call builds its own tables and takes its own arenas,
    so each result is bit-identical to the same call made alone, and equal to numpy."""

    def nested(a, h0, xs):
        def outer(h, x):
            g, _ = dq.scan(lambda g, xx: (dq.tanh(g @ a + xx), None), h, x)
            g = dq.cond(dq.sum(g) > 0.0, lambda v: v * 0.5, lambda v: v + 1.0, g)
            return g, dq.sum(g * g)

        return dq.scan(outer, h0, xs)

    def newton(a, x0):
        def body(c):
            nx = 0.5 * (c[0] + a / c[0])
            return nx, nx - c[0]

        return dq.while_loop(lambda c: dq.max(dq.abs(c[1])) > 1e-9, body, (x0, x0))[0]

    rng = np.random.default_rng(5)
    a = rng.standard_normal((4, 4)) * 0.4
    data = [(a, rng.standard_normal((3, 4)), rng.standard_normal((5, 4, 3, 4))) for _ in range(8)]
    roots = [(rng.uniform(1.0, 9.0, (3, 5)), np.ones((3, 5))) for _ in range(8)]
    prog, _, _ = compiled(nested, *data[0])
    loop, _, _ = compiled(newton, *roots[0])
    alone = [prog(*d) for d in data]
    for (a_, h, xs), (got_h, got_ys) in zip(data, alone):
        for x in xs:  # numpy's loop: an oracle that is not the IR
            for xx in x:
                h = np.tanh(h @ a_ + xx)
            h = h * 0.5 if h.sum() > 0 else h + 1.0
        np.testing.assert_allclose(got_h, h, rtol=1e-10, atol=1e-12)
    out: dict = {}

    def work(i):
        for r in range(10):
            k = (i + r) % 8
            out[i, r] = prog(*data[k]), loop(*roots[k])

    assert run_at_once(work, n=8) == []
    for (i, r), (got, root) in out.items():
        k = (i + r) % 8
        for g, w in zip(got, alone[k]):
            np.testing.assert_array_equal(g, w)
        np.testing.assert_allclose(root, np.sqrt(roots[k][0]), rtol=1e-12)


@pytest.fixture
def busy_process():
    """`python -c 'while True: pass'` on one of our CPUs for the test's duration."""
    cpu = max(os.sched_getaffinity(0))
    spinner = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    time.sleep(0.2)
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait(30)


def test_right_answers_beside_a_busy_process_from_two_threads(gru, busy_process):
    prog, m, name = gru
    d = gru_args(5)
    want = interpret(m, name, *[a.astype(np.float64) for a in d])
    out: dict = {}
    assert run_at_once(lambda i: out.__setitem__(i, [prog(*d) for _ in range(10)]), n=2) == []
    for results in out.values():
        for got in results:
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-5)


def deep_body(depth):
    def f(w, h0, xs):
        def body(h, x):
            v = h + x
            for k in range(depth):
                if k % 25 == 24:
                    v = v @ w  # products keep the body from fusing into one kernel
                elif k % 3 == 0:
                    v = dq.tanh(v) * 0.9
                elif k % 3 == 1:
                    v = v + h * 0.01
                else:
                    v = dq.sin(v) - x * 0.02
            return v, v * 1.0

        return dq.scan(body, h0, xs)

    return f


def test_a_body_hundreds_of_ops_deep():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((4, 4)) * 0.5).astype(np.float32)
    h0 = rng.standard_normal((3, 4)).astype(np.float32)
    xs = rng.standard_normal((6, 3, 4)).astype(np.float32)
    prog, m, name = compiled(deep_body(300), w, h0, xs)
    got = prog(w, h0, xs)
    want = interpret(m, name, w.astype(np.float64), h0.astype(np.float64), xs.astype(np.float64))
    for g, wv in zip(got, want):
        np.testing.assert_allclose(g, wv, rtol=1e-3, atol=1e-4)


def test_a_long_scan_against_a_numpy_loop():
    steps = 50_000
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((8, 8)) * 0.3).astype(np.float32)
    h0 = rng.standard_normal((2, 8)).astype(np.float32)
    xs = (rng.standard_normal((steps, 2, 8)) * 0.1).astype(np.float32)

    def f(a, h0, xs):
        return dq.scan(lambda h, x: (dq.tanh(h @ a + x),) * 2, h0, xs, reverse=True)

    prog, _, _ = compiled(f, a, h0, xs)
    h, ys = prog(a, h0, xs)
    want_h, want_ys = h0.astype(np.float64), np.empty(xs.shape)
    for t in range(steps - 1, -1, -1):
        want_h = np.tanh(want_h @ a + xs[t])
        want_ys[t] = want_h
    np.testing.assert_allclose(h, want_h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ys, want_ys, rtol=1e-4, atol=1e-4)


_LONG_LOOP = """
import sys, threading, time
import numpy as np, dlvm_eq as dq
a = np.eye(16, dtype=np.float32) * 0.5
h0 = np.ones((4, 16), np.float32)
xs = np.zeros((200_000, 4, 16), np.float32)
f = dq.jit(lambda a, h0, xs: dq.scan(lambda h, x: (dq.tanh(h @ a + x), None), h0, xs)[0])
f(a, h0, xs[:10])
assert np.allclose(f(a, h0, xs[:2]), np.tanh(np.tanh(h0 * 0.5) * 0.5))
print("ready", flush=True)
"""

SCRIPTS = {
    # the main thread leaves (sys.exit) while a daemon thread is inside a native loop
    "exit beside a loop": _LONG_LOOP
    + """
def forever():
    while True:
        f(a, h0, xs)
threading.Thread(target=forever, daemon=True).start()
time.sleep(0.3)
sys.exit(0)
""",
    # SIGINT arrives while the main thread is inside a native loop: KeyboardInterrupt after it
    "sigint in a loop": _LONG_LOOP
    + """
while True:
    f(a, h0, xs)
""",
    # sys.exit from another thread ends that thread only: the loop on the main thread finishes
    "sys.exit on another thread": _LONG_LOOP
    + """
t = threading.Thread(target=lambda: (time.sleep(0.1), sys.exit(3)))
t.start()
out = f(a, h0, xs)
t.join()
assert np.all(np.isfinite(out))
""",
}


@pytest.mark.parametrize("kind", sorted(SCRIPTS))
def test_a_process_leaving_during_a_loop_exits_cleanly(kind, tmp_path):
    script = tmp_path / "loop_exit.py"
    script.write_text(textwrap.dedent(SCRIPTS[kind]))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal's foreground job gets it: a shell starts a background job
        # (CI's runner, say) with SIGINT ignored, and the child would inherit that
        preexec_fn=_sigint_default,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        if kind == "sigint in a loop":
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{kind}: the process did not exit within {LIMIT_S} s")
    assert "Fatal Python error" not in err and "Segmentation" not in err, err[-2000:]
    if kind == "sigint in a loop":
        # CPython ends an uncaught KeyboardInterrupt by the signal itself (exit status -2)
        assert proc.returncode == -signal.SIGINT, (proc.returncode, err[-2000:])
        assert err.rstrip().endswith("KeyboardInterrupt"), err[-2000:]
    else:
        assert proc.returncode == 0, err[-2000:]


_INTERRUPTED = """
import sys, time
import numpy as np, dlvm_eq as dq
from dlvm_eq.pipeline.loops import compile_loops

def spin(h, go):  # runs until `go` is 0: never, with go = 1
    return dq.while_loop(lambda c: c[1] > 0.0, lambda c: (dq.tanh(c[0]) * 2.0, c[1]), (h, go))[0]

def scan(h):  # a billion steps: about 5 minutes, far past the test's limit
    return dq.scan(lambda c, _: (dq.tanh(c) * 2.0, None), h, None, length=10**9)[0]

def nested_spin(h, go):  # a scan whose body's while loop never ends (with go = 1)
    return dq.scan(lambda c, _: (spin(c, go), None), h, None, length=3)[0]

def nested_scan(h):  # a scan whose body is a scan of a billion steps
    return dq.scan(lambda c, _: (scan(c), None), h, None, length=3)[0]

h = np.full((4, 8), 0.5, np.float32)
progs = {}
for name, f, args in (
    ("while", spin, (h, np.float32(1))),
    ("scan", scan, (h,)),
    ("nested-while", nested_spin, (h, np.float32(1))),
    ("nested-scan", nested_scan, (h,)),
):
    m = dq.make_ir(f)(*args)
    progs[name] = compile_loops(m, next(iter(m.functions)), "cpu"), args
    assert progs[name][0].report.drivers == ["native"], progs[name][0].report.drivers
# the while loop's program runs and stops where its test says (go = 0: no step)
np.testing.assert_array_equal(progs["while"][0](h, np.float32(0)), h)
for name, (prog, args) in progs.items():
    print("looping", name, flush=True)
    t0 = time.perf_counter()
    try:
        prog(*args)
        print("finished", name, flush=True)
    except KeyboardInterrupt:
        print("interrupted", name, f"{time.perf_counter() - t0:.2f}", flush=True)
    # the arena went back and the programs still give right answers
    np.testing.assert_array_equal(progs["while"][0](h, np.float32(0)), h)
    np.testing.assert_array_equal(progs["nested-while"][0](h, np.float32(0)), h)
print("done", flush=True)
"""


NAMES = ("while", "scan", "nested-while", "nested-scan")


def _line_within(proc, seconds: float) -> str:
    """The child's next line, or TimeoutExpired (a loop that Ctrl-C did not stop fails the
    test instead of hanging it in readline)."""
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    if not ready:
        raise subprocess.TimeoutExpired(proc.args, seconds)
    return proc.stdout.readline().strip()


def test_ctrl_c_stops_a_long_native_loop_between_steps(tmp_path):
    """SIGINT while the main thread is inside a native while loop that never ends, then inside
    a scan of 10**9 steps, then inside the same loops as the body of a scan: each raises
    KeyboardInterrupt (the driver returns to Python about every 10 ms, an inner loop's parents
    with it), the program stays usable, and the process ends normally. Without the driver's
    pauses the first loop would never end and the test would hit its limit; before inner
    loops paused, the third."""
    script = tmp_path / "loop_interrupt.py"
    script.write_text(textwrap.dedent(_INTERRUPTED))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_default,  # as a terminal's foreground job gets it
    )
    lines = []
    try:
        for name in NAMES:
            line = proc.stdout.readline().strip()
            assert line == f"looping {name}", (line, proc.stderr.read()[-2000:])
            time.sleep(0.5)  # inside the native loop by now (no compile left)
            proc.send_signal(signal.SIGINT)
            lines.append(_line_within(proc, LIMIT_S))
        # (read through the text streams: the last readline may hold "done" in its buffer,
        # which communicate(), reading the pipes' descriptors, would miss)
        proc.wait(timeout=LIMIT_S)
        out, err = proc.stdout.read(), proc.stderr.read()
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the loop did not stop within {LIMIT_S} s of Ctrl-C: {lines}")
    assert [ln.split()[:2] for ln in lines] == [["interrupted", name] for name in NAMES]
    assert out.strip() == "done" and proc.returncode == 0, err[-2000:]
