"""While loops, fori_loops with traced bounds, swapped carries and kernels split over threads on
the native loop driver (codegen/execution/native_loop.py). Every result is checked against the
reference interpreter in float64 and against the Python driver; `report.drivers` must say
"native", so a test of the native path fails if the loop silently ran in Python."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_native_loop import close, compiled

import dlvm_eq as dq
from dlvm_eq.codegen.planning.loop_plan import loop_plan
from dlvm_eq.ir.interp import interpret
from dlvm_eq.pipeline import loops


def newton_sqrt(a, x0, tol):
    """Newton's iteration for sqrt(a) until every entry moves less than tol: a while loop whose
    step count depends on the data."""

    def cond(c):
        x, dx = c
        return dq.max(dq.abs(dx)) > tol

    def body(c):
        x, _ = c
        nx = 0.5 * (x + a / x)
        return nx, nx - x

    return dq.while_loop(cond, body, (x0, x0))[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_data_dependent_while_loop_runs_natively(dtype, monkeypatch):
    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 40.0, (5, 7)).astype(dtype)
    x0 = np.ones((5, 7), dtype)
    tol = np.asarray(1e-5, dtype)
    prog, m = compiled(newton_sqrt, a, x0, tol)
    assert prog.report.drivers == ["native"], prog.report.drivers
    got = prog(a, x0, tol)
    want = interpret(m, prog.name, a, x0, tol)
    close(got, want, dtype == np.float64)
    np.testing.assert_allclose(got, np.sqrt(a.astype(np.float64)), rtol=1e-4)
    slow, _ = compiled(newton_sqrt, a, x0, tol, native=False, monkeypatch=monkeypatch)
    assert slow.report.drivers == ["native loops are off"]
    np.testing.assert_array_equal(slow(a, x0, tol), got)  # the same kernels in the same order


def fori(a, h0, lo, hi):
    return dq.fori_loop(lo, hi, lambda i, h: dq.tanh(h @ a) + dq.astype(i, h.dtype) * 0.01, h0)


@pytest.mark.parametrize("bounds", [(0, 0), (3, 2), (0, 1), (2, 9)])
def test_fori_loop_with_traced_bounds_runs_natively(bounds):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 4)) * 0.5
    h0 = rng.standard_normal((3, 4))
    lo, hi = (np.int32(b) for b in bounds)
    prog, m = compiled(fori, a, h0, lo, hi)
    assert prog.report.drivers == ["native"], prog.report.drivers
    got = prog(a, h0, lo, hi)
    want = h0.copy()
    for i in range(bounds[0], bounds[1]):  # numpy's loop: an oracle that is not the IR
        want = np.tanh(want @ a) + i * 0.01
    close(got, want, True)
    close(got, interpret(m, prog.name, a, h0, lo, hi), True)


def test_carries_with_their_own_result_buffer_swap_instead_of_copying(monkeypatch):
    """A scan of an odd and an even length: the final carry is in the other buffer after an odd
    number of steps. Bit-identical to the Python driver."""

    def f(a, h0, xs):
        return dq.scan(lambda h, x: (dq.tanh(h @ a + x), h * 2.0), h0, xs)

    rng = np.random.default_rng(2)
    a = rng.standard_normal((6, 6)).astype(np.float32) * 0.4
    h0 = rng.standard_normal((2, 6)).astype(np.float32)
    for steps in (3, 4):
        xs = rng.standard_normal((steps, 2, 6)).astype(np.float32)
        prog, m = compiled(f, a, h0, xs)
        assert prog.report.drivers == ["native"], prog.report.drivers
        bodies = [r.plan for label, r in prog.report.parts if label.endswith("= scan")]
        assert [loop_plan(b, 1, 1).swapped for b in bodies] == [{0: bodies[0].results[0].slot}]
        got = prog(a, h0, xs)
        want = interpret(m, prog.name, *(v.astype(np.float64) for v in (a, h0, xs)))
        for g, w in zip(got, want):
            close(g, w, False)
        slow, _ = compiled(f, a, h0, xs, native=False, monkeypatch=monkeypatch)
        for g, s in zip(got, slow(a, h0, xs)):
            np.testing.assert_array_equal(g, s)
        monkeypatch.setattr(loops, "NATIVE_LOOPS", True)


def test_a_body_with_kernels_split_over_threads_runs_natively(monkeypatch):
    """A 400 x 400 elementwise body: a plain call splits its kernel over threads; the driver
    runs it whole on its own thread, the same bits as the Python driver's threaded calls."""

    def f(h0, xs):
        return dq.scan(lambda h, x: (dq.tanh(h * 0.5 + x), dq.sum(h, axis=1)), h0, xs)

    rng = np.random.default_rng(3)
    h0 = rng.standard_normal((400, 400))
    xs = rng.standard_normal((3, 400, 400))
    prog, m = compiled(f, h0, xs)
    assert prog.report.drivers == ["native"], prog.report.drivers
    got = prog(h0, xs)
    want = h0.copy()
    wys = []
    for t in range(3):
        wys.append(want.sum(axis=1))
        want = np.tanh(want * 0.5 + xs[t])
    close(got[0], want, True)
    close(got[1], np.stack(wys), True)
    slow, _ = compiled(f, h0, xs, native=False, monkeypatch=monkeypatch)
    for g, s in zip(got, slow(h0, xs)):
        np.testing.assert_array_equal(g, s)


OPS = ["tanh", "@a", "*x", "+w", "sin"]


@st.composite
def while_bodies(draw):
    return {
        "ops": draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=5)),
        "steps": draw(st.sampled_from([0, 1, 2, 7])),
        "f64": draw(st.booleans()),
        "counter_first": draw(st.booleans()),
    }


def while_program(p):
    def f(a, h0, w, n):
        def body(c):
            i, h = (c[0], c[1]) if p["counter_first"] else (c[1], c[0])
            for op in p["ops"]:
                if op == "tanh":
                    h = dq.tanh(h)
                elif op == "@a":
                    h = h @ a
                elif op == "*x":
                    h = h * dq.astype(i, h.dtype) * 0.1
                elif op == "+w":
                    h = h + w
                else:
                    h = dq.sin(h)
            return (i + 1, h) if p["counter_first"] else (h, i + 1)

        def cond(c):
            return (c[0] if p["counter_first"] else c[1]) < n

        zero = dq.astype(n * 0, "i32")
        init = (zero, h0) if p["counter_first"] else (h0, zero)
        out = dq.while_loop(cond, body, init)
        return out[1] if p["counter_first"] else out[0]

    return f


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(while_bodies(), st.integers(0, 2**16))
def test_random_while_bodies_equal_the_interpreter(p, seed):
    dt = np.float64 if p["f64"] else np.float32
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((5, 5)) * 0.4).astype(dt)
    h0 = rng.standard_normal((3, 5)).astype(dt)
    w = rng.standard_normal((3, 5)).astype(dt)
    n = np.int32(p["steps"])
    prog, m = compiled(while_program(p), a, h0, w, n)
    assert prog.report.drivers == ["native"], prog.report.drivers
    got = prog(a, h0, w, n)
    f64 = [x.astype(np.float64) for x in (a, h0, w)]
    want = interpret(m, prog.name, *f64, n)
    close(got, want, p["f64"])
