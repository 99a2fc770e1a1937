"""Scans whose bodies have loops or branches of their own (a scan in a scan, a cond or a while
loop in a scan) on the native loop driver (codegen/execution/native_nest.py). Each result is
checked against the reference interpreter in float64 and against the Python driver, and
`report.drivers` must say "native" for the outer scan, so a test of the native path fails if
the loop silently ran in Python."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_native_loop import close, compiled

import dlvm_eq as dq
from dlvm_eq.ir.interp import interpret


def scan_in_scan(a, h0, xs):
    def outer(h, x):  # the inner scan runs over this step's slice of xs
        g, ys = dq.scan(lambda g, xx: (dq.tanh(g @ a + xx), g * 2.0), h, x)
        return g + 1.0, dq.sum(ys, axis=0)

    return dq.scan(outer, h0, xs)


def cond_in_scan(a, h0, xs):
    def outer(h, x):
        h = dq.cond(dq.sum(h) > 0.0, lambda v: dq.tanh(v @ a), lambda v: v * 0.5 + 1.0, h)
        return h + x, h

    return dq.scan(outer, h0, xs)


def while_in_scan(a, h0, xs):
    def outer(h, x):  # the while body reads this step's x
        body = lambda s: (s[0] + 1, dq.tanh(s[1] @ a + x))
        _, h2 = dq.while_loop(lambda s: s[0] < 3, body, (0, h))
        return h2, h2 * 2.0

    return dq.scan(outer, h0, xs, reverse=True)


NUMPY = {  # the same programs as numpy loops: oracles that are not the IR
    "scan_in_scan": lambda a, h, xs: _np_scan_in_scan(a, h, xs),
    "cond_in_scan": lambda a, h, xs: _np_cond_in_scan(a, h, xs),
    "while_in_scan": lambda a, h, xs: _np_while_in_scan(a, h, xs),
}


def _np_scan_in_scan(a, h, xs):
    outs = []
    for x in xs:
        g, ys = h, []
        for xx in x:
            ys.append(g * 2.0)
            g = np.tanh(g @ a + xx)
        h = g + 1.0
        outs.append(np.sum(ys, axis=0) if ys else np.zeros_like(h))
    return h, np.stack(outs)


def _np_cond_in_scan(a, h, xs):
    outs = []
    for x in xs:
        h = np.tanh(h @ a) if h.sum() > 0 else h * 0.5 + 1.0
        outs.append(h)
        h = h + x
    return h, np.stack(outs)


def _np_while_in_scan(a, h, xs):
    outs = [None] * len(xs)
    for t in range(len(xs) - 1, -1, -1):
        for _ in range(3):
            h = np.tanh(h @ a + xs[t])
        outs[t] = h * 2.0
    return h, np.stack(outs)


@pytest.mark.parametrize("f", [scan_in_scan, cond_in_scan, while_in_scan])
def test_nested_loops_run_natively(f, monkeypatch):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 4)) * 0.5
    h0 = rng.standard_normal((3, 4))
    shape = (5, 6, 3, 4) if f is scan_in_scan else (6, 3, 4)
    xs = rng.standard_normal(shape)
    prog, m = compiled(f, a, h0, xs)
    assert prog.report.drivers == ["native"], prog.report.drivers
    got = prog(a, h0, xs)
    for g, w, n in zip(got, interpret(m, prog.name, a, h0, xs), NUMPY[f.__name__](a, h0, xs)):
        close(g, w, True)
        close(g, n, True)
    slow, _ = compiled(f, a, h0, xs, native=False, monkeypatch=monkeypatch)
    assert slow.report.drivers == ["native loops are off"]
    for g, s in zip(got, slow(a, h0, xs)):
        np.testing.assert_array_equal(g, s)  # the same kernels in the same order


def test_the_gradient_through_a_scan_in_a_scan(monkeypatch):
    def loss(a, h0, xs):
        h, ys = scan_in_scan(a, h0, xs)
        return dq.sum(ys * ys) + dq.sum(h)

    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 4)) * 0.4
    h0 = rng.standard_normal((3, 4)) * 0.5
    xs = rng.standard_normal((3, 4, 3, 4)) * 0.5
    prog, m = compiled(dq.value_and_grad(loss, argnums=(0, 2)), a, h0, xs)
    assert prog.report.drivers and set(prog.report.drivers) == {"native"}, prog.report.drivers
    got = prog(a, h0, xs)
    want = interpret(m, prog.name, a, h0, xs)
    for g, w in zip(got, want):
        close(g, w, True)
    # the directional derivative against float64 central differences
    d = rng.standard_normal(a.shape)
    eps = 1e-6
    fd = (prog(a + eps * d, h0, xs)[0] - prog(a - eps * d, h0, xs)[0]) / (2 * eps)
    np.testing.assert_allclose(np.sum(got[1] * d), fd, rtol=1e-5)


INNER = ["scan", "scan_reverse", "cond", "switch", "while", "none"]


@st.composite
def nested_bodies(draw):
    return {
        "inner": draw(st.lists(st.sampled_from(INNER), min_size=1, max_size=3)),
        "length": draw(st.sampled_from([0, 2, 5])),
        "inner_length": draw(st.sampled_from([0, 2, 3])),
        "reverse": draw(st.booleans()),
        "f64": draw(st.booleans()),
    }


def nested_program(p):
    def f(a, h0, xs, zs):
        def outer(h, x):
            z = x[0]  # a (steps, 3, 4) slice: its first row is this step's addend
            for kind in p["inner"]:
                if kind.startswith("scan"):
                    h, _ = dq.scan(
                        lambda g, xx: (dq.tanh(g @ a + xx), None), h, x, reverse=kind != "scan"
                    )
                elif kind == "cond":
                    h = dq.cond(dq.sum(h) > 0.0, lambda v: v @ a, lambda v: dq.sin(v) + z, h)
                elif kind == "switch":  # -1 (clamped to 0), 0, 1 or 2
                    k = (dq.sum(h) > 0.0).astype("i32") * 2 + (dq.sum(z) > 0.0).astype("i32") - 1
                    branches = [lambda v: v @ a, lambda v: dq.cos(v) * z, lambda v: v * 0.5 - 1.0]
                    h = dq.switch(k, branches, h)
                elif kind == "while":
                    body = lambda s: (s[0] + 1, dq.tanh(s[1] * 0.5 + z))
                    h = dq.while_loop(lambda s: s[0] < 2, body, (0, h))[1]
                else:
                    h = h * 0.9 + z
            return h, dq.sum(h * h, axis=1)

        return dq.scan(outer, h0 + zs, xs, reverse=p["reverse"])

    return f


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(nested_bodies(), st.integers(0, 2**16))
def test_random_nested_bodies_equal_the_interpreter(p, seed):
    dt = np.float64 if p["f64"] else np.float32
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((4, 4)) * 0.4).astype(dt)
    h0 = rng.standard_normal((3, 4)).astype(dt)
    inner = max(p["inner_length"], 1)  # x[0] needs a row
    xs = (rng.standard_normal((p["length"], inner, 3, 4)) * 0.5).astype(dt)
    zs = np.zeros((3, 4), dt)
    prog, m = compiled(nested_program(p), a, h0, xs, zs)
    assert prog.report.drivers == ["native"], prog.report.drivers
    got = prog(a, h0, xs, zs)
    want = interpret(m, prog.name, *(v.astype(np.float64) for v in (a, h0, xs, zs)))
    for g, w in zip(got, want):
        close(g, w, p["f64"])


def switch_in_scan(a, h0, xs, ks):
    def outer(h, xk):  # the branch is this step's k, clamped to the three branches
        x, k = xk
        branches = [lambda v: dq.tanh(v @ a), lambda v: v * 0.5 + x, lambda v: dq.sin(v) - 1.0]
        h = dq.switch(k, branches, h)
        return h, h * 2.0

    return dq.scan(outer, h0, (xs, ks))


def _np_switch_in_scan(a, h, xs, ks):
    outs = []
    for x, k in zip(xs, ks):
        k = min(max(int(k), 0), 2)
        h = [np.tanh(h @ a), h * 0.5 + x, np.sin(h) - 1.0][k]
        outs.append(h * 2.0)
    return h, np.stack(outs) if outs else np.zeros((0, *h.shape))


@pytest.mark.parametrize("steps", [0, 1, 2, 9])
def test_a_switch_in_a_scan_runs_natively(steps, monkeypatch):
    """Before, a switch in a body sent its scan to the Python driver."""
    rng = np.random.default_rng(steps)
    a = rng.standard_normal((4, 4)) * 0.5
    h0 = rng.standard_normal((3, 4))
    xs = rng.standard_normal((steps, 3, 4))
    ks = np.array([0, 1, 2, -3, 5, 1, 0, 2, 7][:steps], np.int32)
    prog, m = compiled(switch_in_scan, a, h0, xs, ks)
    # (a scan of one step is inlined: its switch runs as the function's own)
    assert prog.report.drivers == ([] if steps == 1 else ["native"]), prog.report.drivers
    got = prog(a, h0, xs, ks)
    want = interpret(m, prog.name, a, h0, xs, ks)
    for g, w, n in zip(got, want, _np_switch_in_scan(a, h0, xs, ks)):
        close(g, w, True)
        close(g, n, True)
    slow, _ = compiled(switch_in_scan, a, h0, xs, ks, native=False, monkeypatch=monkeypatch)
    assert slow.report.drivers == ([] if steps == 1 else ["native loops are off"])
    for g, s in zip(got, slow(a, h0, xs, ks)):
        np.testing.assert_array_equal(g, s)


def scan_in_while(a, h0, xs, n):
    def body(c):
        i, h = c
        h, _ = dq.scan(lambda g, x: (dq.tanh(g @ a + x), None), h, xs)
        return i + 1, h

    return dq.while_loop(lambda c: c[0] < n, body, (n * 0, h0))[1]


@pytest.mark.parametrize("n", [0, 1, 3])
def test_a_while_loop_with_a_scan_in_its_body_runs_natively(n, monkeypatch):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((4, 4)) * 0.5
    h0 = rng.standard_normal((3, 4))
    xs = rng.standard_normal((5, 3, 4))
    prog, m = compiled(scan_in_while, a, h0, xs, np.int32(n))
    assert prog.report.drivers == ["native"], prog.report.drivers
    got = prog(a, h0, xs, np.int32(n))
    want = h0
    for _ in range(n):
        for x in xs:
            want = np.tanh(want @ a + x)
    close(got, want, True)
    close(got, interpret(m, prog.name, a, h0, xs, np.int32(n)), True)
    slow, _ = compiled(scan_in_while, a, h0, xs, np.int32(n), native=False, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(slow(a, h0, xs, np.int32(n)), got)


def test_a_while_loop_with_max_steps_and_its_gradient_run_natively():
    """while_loop(max_steps=N) is a scan whose body is a cond: forward and backward scans run
    natively; the value against numpy, the gradient against the interpreter and float64
    central differences."""

    def loss(a, h0):
        body = lambda c: c @ a + 0.1
        h = dq.while_loop(lambda c: dq.sum(c * c) < 50.0, body, h0, max_steps=12)
        return dq.sum(h * h)

    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 4)) * 0.3 + np.eye(4)
    h0 = rng.standard_normal((3, 4)) * 0.3
    prog, m = compiled(dq.value_and_grad(loss, argnums=(0, 1)), a, h0)
    assert prog.report.drivers == ["native", "native"], prog.report.drivers
    got = prog(a, h0)
    h = h0
    for _ in range(12):
        if np.sum(h * h) < 50.0:
            h = h @ a + 0.1
    close(got[0], np.sum(h * h), True)
    for g, w in zip(got, interpret(m, prog.name, a, h0)):
        close(g, w, True)
    d = rng.standard_normal(a.shape)
    eps = 1e-6
    fd = (prog(a + eps * d, h0)[0] - prog(a - eps * d, h0)[0]) / (2 * eps)
    np.testing.assert_allclose(np.sum(got[1] * d), fd, rtol=1e-5)


@pytest.mark.parametrize("f", [scan_in_scan, while_in_scan, switch_in_scan])
def test_nested_loops_paused_at_every_step_give_the_same_bits(f, monkeypatch):
    """With a budget of one cycle the driver returns to Python after every step of every
    level, inner loops mid-step included (their parents resume at the record that runs them):
    the results are the bits of an uninterrupted run. Before, an inner loop ran to its end."""
    from dlvm_eq.codegen.execution import native_loop, native_nest

    rng = np.random.default_rng(4)
    a = rng.standard_normal((4, 4)) * 0.5
    h0 = rng.standard_normal((3, 4))
    xs = rng.standard_normal((5, 6, 3, 4) if f is scan_in_scan else (6, 3, 4))
    args = (a, h0, xs) + ((np.array([2, 0, 1, 9, -1, 1], np.int32),) if f is switch_in_scan else ())
    prog, _ = compiled(f, *args)
    assert prog.report.drivers == ["native"], prog.report.drivers
    whole = prog(*args)
    calls = []

    def counting_drive(driver, *rest):
        def counted(*a):
            calls.append(1)
            driver(*a)

        return native_loop.drive(counted, *rest)

    monkeypatch.setattr(native_loop, "BUDGET_CYCLES", 1)
    monkeypatch.setattr(native_nest, "drive", counting_drive)
    paused = prog(*args)
    for g, w in zip(paused, whole):
        np.testing.assert_array_equal(g, w)
    # a return after every inner step (the last one ends its loop: the outer step goes on)
    # and after every outer step: 5 outer steps of 6 inner ones; 6 outer steps of a while
    # loop of 3 steps and its failing test; 6 steps whose branches are one-step loops
    returns = {scan_in_scan: 5 * 6, while_in_scan: 6 * 4, switch_in_scan: 6}[f]
    assert len(calls) == returns, len(calls)


def test_a_nested_scan_makes_its_tables_once(monkeypatch):
    """The tables are made on the first call (about 0.2 ms); later calls with other arrays
    write only their buffers' addresses, with right answers."""
    from dlvm_eq.codegen.execution import native_nest

    made = []

    class Counted(native_nest._Build):
        def __init__(self):
            made.append(1)
            super().__init__()

    monkeypatch.setattr(native_nest, "_Build", Counted)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((4, 4)) * 0.5
    h0 = rng.standard_normal((3, 4))
    prog, m = compiled(scan_in_scan, a, h0, rng.standard_normal((4, 2, 3, 4)))
    assert prog.report.drivers == ["native"], prog.report.drivers
    for _ in range(4):
        a2, h2 = rng.standard_normal((4, 4)) * 0.5, rng.standard_normal((3, 4))
        xs = rng.standard_normal((4, 2, 3, 4))
        got = prog(a2, h2, xs)
        for g, w, n in zip(got, interpret(m, prog.name, a2, h2, xs), _np_scan_in_scan(a2, h2, xs)):
            close(g, w, True)
            close(g, n, True)
    assert len(made) == 1, len(made)


def switch_in_while(a, h0, n):
    def body(c):
        i, h = c  # branch i - 1: clamped to 0 at i = 0 and to 2 from i = 3
        h = dq.switch(i - 1, [lambda v: dq.tanh(v @ a), lambda v: v * 0.5 + 1.0, dq.sin], h)
        return i + 1, h

    return dq.while_loop(lambda c: c[0] < n, body, (n * 0, h0))[1]


@pytest.mark.parametrize("n", [0, 1, 5])
def test_a_switch_in_a_while_loop_runs_natively(n, monkeypatch):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((4, 4)) * 0.5
    h0 = rng.standard_normal((3, 4))
    prog, m = compiled(switch_in_while, a, h0, np.int32(n))
    assert prog.report.drivers == ["native"], prog.report.drivers
    got = prog(a, h0, np.int32(n))
    want = h0
    for i in range(n):
        want = [np.tanh(want @ a), want * 0.5 + 1.0, np.sin(want)][min(max(i - 1, 0), 2)]
    close(got, want, True)
    close(got, interpret(m, prog.name, a, h0, np.int32(n)), True)
    slow, _ = compiled(switch_in_while, a, h0, np.int32(n), native=False, monkeypatch=monkeypatch)
    assert slow.report.drivers == ["native loops are off"]
    np.testing.assert_array_equal(slow(a, h0, np.int32(n)), got)
