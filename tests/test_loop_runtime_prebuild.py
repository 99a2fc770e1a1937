"""pipeline/loops.py starts building the native loops' runtime (the loop driver, our GEMM for
prepacked weights) on another thread when it compiles a function with a scan for the cpu, once
per process, so that it overlaps the e-graph; the scan then runs equal to the interpreter."""

from __future__ import annotations

import threading

import numpy as np

import dlvm_eq as dq
from dlvm_eq.codegen.runtime import cpu_count
from dlvm_eq.ir import interpret
from dlvm_eq.pipeline import loops

RNG = np.random.default_rng(30)


def _rnn(w, h0, xs):
    return dq.scan(lambda h, x: (dq.tanh(h @ w + x), dq.sum(h)), h0, xs)


def test_a_scan_starts_the_runtime_build_once_and_runs_as_the_interpreter(monkeypatch):
    started = []
    ran = threading.Event()
    monkeypatch.setattr(loops, "_prebuilt", [])
    monkeypatch.setattr(cpu_count, "usable_cpus", lambda: 2)
    monkeypatch.setattr(loops, "_build_runtime", lambda gemm: started.append(gemm) or ran.set())
    w = (RNG.standard_normal((5, 5)) * 0.3).astype(np.float32)
    h0 = RNG.standard_normal((3, 5)).astype(np.float32)
    xs = RNG.standard_normal((4, 3, 5)).astype(np.float32)
    straight = dq.jit(lambda a: dq.tanh(a) * 2.0)
    straight(h0)
    assert started == [] and loops._prebuilt == []  # no scan: nothing started
    f = dq.jit(_rnn)
    got = f(w, h0, xs)
    assert ran.wait(10) and started == [()]  # 5 x 5 products: no GEMM on packed weights
    m = dq.make_ir(_rnn)(w, h0, xs)
    want = interpret(m, next(iter(m.functions)), w, h0, xs, float64=True)
    for g, x in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), x, rtol=1e-5, atol=1e-5)
    g = dq.jit(lambda w, h0, xs: _rnn(w * 2.0, h0, xs))  # a second scan: not started again
    g(w, h0, xs)
    loops._prebuilt[0].join(10)
    assert started == [()]


def test_one_cpu_builds_the_runtime_where_it_is_used(monkeypatch):
    monkeypatch.setattr(loops, "_prebuilt", [])
    monkeypatch.setattr(cpu_count, "usable_cpus", lambda: 1)
    w = np.eye(4, dtype=np.float32)
    f = dq.jit(_rnn)
    f(w, np.ones((2, 4), np.float32), np.ones((3, 2, 4), np.float32))
    assert loops._prebuilt == []


def test_the_gemm_is_built_ahead_only_for_products_it_may_run():
    """Our GEMM on a prepacked weight takes products of at most 64 rows whose weight has
    k n >= 2**14 (execution/packed_products.py): the GRU's at hidden 256, not at 64."""

    def body_of(hidden):
        u = np.zeros((hidden, hidden), np.float32)
        m = dq.make_ir(lambda h0, xs: dq.scan(lambda h, x: (dq.tanh(h @ u + x), None), h0, xs)[0])(
            np.zeros((16, hidden), np.float32), np.zeros((3, 16, hidden), np.float32)
        )
        return m.functions[next(iter(m.functions))]

    # the rows pick the tile (gemm_runtime.packed_b_gemm): 16 rows here
    assert loops._may_prepack(body_of(256)) == (16,) and loops._may_prepack(body_of(64)) == ()


def test_a_loop_without_packed_weights_does_not_build_the_gemm(monkeypatch):
    from dlvm_eq.codegen.execution import packed_products

    def no_gemm(m):
        raise AssertionError("our GEMM built for a loop that packs no weight")

    monkeypatch.setattr(packed_products, "packed_b_gemm", no_gemm)
    assert packed_products.pack_buffers([]) == []
