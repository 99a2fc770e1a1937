"""dq.jit / dq.compile optimize a function with loops and every body it reaches in ONE e-graph
session (pipeline/loops.py -> egraph/optimize_loops.py), each body loaded once; the compiled
results equal a float64 numpy oracle, and the native loop driver still runs the scans."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.egraph import optimize as egraph_optimize
from dlvm_eq.egraph import optimize_loops
from dlvm_eq.ir import interpret
from dlvm_eq.ir.control_flow import reachable_bodies
from dlvm_eq.ir.parser import load
from dlvm_eq.pipeline import loops

RNG = np.random.default_rng(30)


@pytest.fixture
def sessions(monkeypatch):
    """The optimizer's e-graph sessions opened while compiling, and the functions loaded into
    each; the process caches of optimized loops emptied, so that this compile builds its
    e-graph. (Differentiation and the fusion decision of each plan have e-graphs of their own:
    other stages, not counted.) A straight function optimized on its own is a session too."""
    monkeypatch.setattr(loops, "_optimized", {})
    monkeypatch.setattr(optimize_loops, "_JOINT", {})
    opened: list[list[str]] = []

    def spy(real):
        def scratch(rules=()):
            cm = real(rules)

            class Wrap:
                def __enter__(self):
                    s = cm.__enter__()
                    names: list[str] = []
                    opened.append(names)
                    add = s.add_function
                    s.add_function = lambda fn, m=None: names.append(fn.name) or add(fn, m)
                    return s

                def __exit__(self, *exc):
                    return cm.__exit__(*exc)

            return Wrap()

        return scratch

    monkeypatch.setattr(optimize_loops, "scratch_session", spy(optimize_loops.scratch_session))
    alone = egraph_optimize._optimize_function  # spied on, not imported

    def on_its_own(module, fn, *rest):
        opened.append([f"alone: {fn.name}"])
        return alone(module, fn, *rest)

    monkeypatch.setattr(egraph_optimize, "_optimize_function", on_its_own)
    return opened


def _rnn_ref(w, u, h0, xs):
    """float64 value and gradient (w.r.t. w and u) of mean(h_t^2) for h' = tanh(x W + h U)."""
    w, u, h, xs = (a.astype(np.float64) for a in (w, u, h0, xs))
    hs, pre = [], []
    for x in xs:
        h = np.tanh(x @ w + h @ u)
        hs.append(h)
    n = len(xs) * h0.size
    loss = sum(float(np.sum(h * h)) for h in hs) / n
    dw, du, dh = np.zeros_like(w), np.zeros_like(u), np.zeros_like(h0, dtype=np.float64)
    for t in range(len(xs) - 1, -1, -1):
        dh = dh + 2.0 * hs[t] / n
        dz = dh * (1.0 - hs[t] ** 2)
        prev = hs[t - 1] if t else h0.astype(np.float64)
        dw += xs[t].astype(np.float64).T @ dz
        du += prev.T @ dz
        dh = dz @ u.T
        pre.append(dz)
    return loss, dw, du


def _rnn_loss(w, u, h0, xs):
    step = lambda h, x: (lambda h: (h, h))(dq.tanh(x @ w + h @ u))
    _, ys = dq.scan(step, h0, xs)
    return dq.mean(ys * ys)


def test_value_and_grad_through_a_scan_compiles_in_one_e_graph(sessions):
    w = (RNG.standard_normal((5, 6)) * 0.3).astype(np.float32)
    u = (RNG.standard_normal((6, 6)) * 0.3).astype(np.float32)
    h0 = RNG.standard_normal((2, 6)).astype(np.float32)
    xs = RNG.standard_normal((7, 2, 5)).astype(np.float32)
    f = dq.jit(dq.value_and_grad(_rnn_loss, argnums=(0, 1)))
    loss, (dw, du) = f(w, u, h0, xs)
    assert len(sessions) == 1, sessions  # pieces, the forward body and its adjoint: one e-graph
    assert len(sessions[0]) >= 3 and len(set(sessions[0])) == len(sessions[0])
    assert f.report(w, u, h0, xs).drivers == ["native", "native"]
    want = _rnn_ref(w, u, h0, xs)
    for got, ref in zip((loss, dw, du), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("p, k", [(True, 0), (False, 1), (True, 2), (False, 7)])
def test_a_body_two_branches_run_is_loaded_once_and_runs_as_the_interpreter(sessions, p, k):
    m = load(Path(__file__).parent / "data" / "control_flow" / "loops.dl")
    x = RNG.standard_normal(4).astype(np.float32)
    got = dq.compile(m, "pick")(np.bool_(p), np.int32(k), x)
    assert len(sessions) == 1  # @neg: a branch of the cond and two of the switch, loaded once
    assert sum(n.startswith("neg") for n in sessions[0]) == 1, sessions
    want = interpret(m, "pick", np.bool_(p), np.int32(k), x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_a_body_written_twice_over_runs_its_products_once(sessions):
    """The e-graph merges equal terms; the cost model prices a DAG, so the deduplicated body
    costs the same as the written one: fewer instructions must break the tie."""
    w = (RNG.standard_normal((6, 6)) * 0.3).astype(np.float32)

    def f(h, xs):
        def step(h, x):
            a = dq.tanh(h @ w + x)
            b = dq.tanh(h @ w + x)  # the same again: the tracer keeps both
            return a, a * b

        return dq.scan(step, h, xs)[1]

    h = RNG.standard_normal((2, 6)).astype(np.float32)
    xs = RNG.standard_normal((5, 2, 6)).astype(np.float32)
    module = dq.make_ir(f)(h, xs)
    name = next(iter(module.functions))
    (body,) = reachable_bodies(module[name])
    assert sum(i.op == "dot" for i in body.body) == 2  # as written: the product twice
    compiled = dq.compile(module, name)
    (label, report), *_ = [p for p in compiled.report.parts if "scan" in p[0]]
    assert len(report.plan.blas_calls) == 1, str(report)
    got = compiled(h, xs)
    hh, want = h.astype(np.float64), []
    for x in xs:
        a = np.tanh(hh @ w + x)
        want.append(a * a)
        hh = a
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-5, atol=1e-6)


def test_compile_without_optimize_builds_no_e_graph(sessions):
    w = RNG.standard_normal((3, 3)).astype(np.float32)
    module = dq.make_ir(lambda h, xs: dq.scan(lambda h, x: (h @ w + x, None), h, xs)[0])(
        np.zeros(3, np.float32), np.ones((2, 3), np.float32)
    )
    name = next(iter(module.functions))
    compiled = dq.compile(module, name, optimize=False)
    got = compiled(np.zeros(3, np.float32), np.ones((2, 3), np.float32))
    assert sessions == []
    want = np.ones(3) @ w.astype(np.float64) + 1.0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_scan_of_another_length_builds_no_second_e_graph(sessions):
    """The one e-graph's choices are kept per straight pieces and bodies: dq.jit at another
    scan length (the same body, no piece reading xs) reuses them. A daemon thread compiling
    then never enters egglog, which it must not be inside of when the interpreter exits."""
    w = (RNG.standard_normal((4, 4)) * 0.5).astype(np.float32)
    f = dq.jit(lambda h, xs: dq.scan(lambda h, x: (dq.tanh(h @ w + x * 1.0), None), h, xs)[0])
    h = RNG.standard_normal((2, 4)).astype(np.float32)
    for steps in (3, 9):
        xs = RNG.standard_normal((steps, 2, 4)).astype(np.float32)
        got = f(h, xs)
        want = h.astype(np.float64)
        for x in xs:
            want = np.tanh(want @ w + x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert len(sessions) == 1, sessions
