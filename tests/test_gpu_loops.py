"""Loops on the gpu target run by the gpu executor (codegen/execution/gpu_loop.py), without a
GPU (fake_cupy.py: every PTX assembled by ptxas, every launch emulated): results against the
reference interpreter in float64 and against the cpu target, `report.drivers` saying the
executor ran each loop, and fake_cupy's `record` showing what one more step costs: its
launches and device copies only, no host transfer, no allocation, no read-back (a while loop:
one read of its condition)."""

from __future__ import annotations

import fake_cupy
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_native_loop import gru_loss  # the same GRU the cpu native-loop tests run

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.execution import gpu_loop
from dlvm_eq.ir.interp import interpret
from dlvm_eq.pipeline.loops import compile_loops

EXECUTOR = "native"  # what report.drivers says of a loop that no Python driver runs


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


@pytest.fixture
def cp(monkeypatch):
    with fake_cupy.installed(monkeypatch, sms=1) as module:
        yield module


def compiled(f, *args, target="gpu"):
    """(f compiled for `target` through the loop drivers, its IR module, its name)"""
    m = dq.make_ir(f)(*args)
    name = next(iter(m.functions))
    return compile_loops(m, name, target), m, name


def on_gpu(cp, f, *leaves):
    out = f(*[cp.asarray(a) for a in leaves])
    out = out if isinstance(out, tuple) else (out,)
    assert all(isinstance(o, fake_cupy.DeviceArray) for o in out)
    return [np.asarray(o) for o in out]


def rnn_args(steps, dtype=np.float64, batch=2, inputs=3, hidden=4, seed=0, gates="zrh"):
    rng = np.random.default_rng(seed)
    p = {}
    for g in gates:
        p[f"w{g}"] = (rng.standard_normal((inputs, hidden)) * 0.4).astype(dtype)
        p[f"u{g}"] = (rng.standard_normal((hidden, hidden)) * 0.4).astype(dtype)
    h0 = (rng.standard_normal((batch, hidden)) * 0.1).astype(dtype)
    xs = rng.standard_normal((steps, batch, inputs)).astype(dtype)
    return p, h0, xs


def lstm_loss(p, hc0, xs):
    def cell(hc, x):
        h, c = hc
        i = dq.sigmoid(x @ p["wi"] + h @ p["ui"])
        f = dq.sigmoid(x @ p["wf"] + h @ p["uf"])
        o = dq.sigmoid(x @ p["wo"] + h @ p["uo"])
        g = dq.tanh(x @ p["wg"] + h @ p["ug"])
        c = f * c + i * g
        h = o * dq.tanh(c)
        return (h, c), h

    (h, c), ys = dq.scan(cell, hc0, xs, reverse=True)
    return dq.sum(ys * ys) + dq.sum(h * c)


@pytest.mark.parametrize("model", ["gru", "lstm"])
def test_rnn_value_and_gradient_on_the_gpu_executor_equal_the_interpreter(cp, model):
    if model == "gru":
        loss, (p, h0, xs) = gru_loss, rnn_args(5)
        args = (p, h0, xs)
    else:
        loss, (p, h0, xs) = lstm_loss, rnn_args(4, gates="ifog")
        args = (p, (h0, np.tanh(h0 * 3.0)), xs)
    f, m, name = compiled(dq.value_and_grad(loss, argnums=(0, 2)), *args)
    assert f.report.drivers and set(f.report.drivers) == {EXECUTOR}, f.report.drivers
    leaves = dq.tree_leaves(args)
    got = on_gpu(cp, f, *leaves)
    want = interpret(m, name, *leaves, float64=True)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)


def _counts(cp, f, leaves) -> dict:
    cp.record.clear()
    on_gpu(cp, f, *leaves)
    return dict(cp.record)


def test_one_more_step_costs_its_launches_and_nothing_crosses_to_the_host(cp):
    def rnn(w, h0, xs):
        return dq.scan(lambda h, x: (dq.tanh(h @ w + x),) * 2, h0, xs)

    rng = np.random.default_rng(1)
    w, h0 = rng.standard_normal((3, 3)) * 0.5, rng.standard_normal((2, 3))
    per = {}
    for n in (3, 4, 7):
        xs = rng.standard_normal((n, 2, 3))
        f, m, name = compiled(rnn, w, h0, xs)
        assert f.report.drivers == [EXECUTOR]
        got = on_gpu(cp, f, w, h0, xs)
        for g, r in zip(got, interpret(m, name, w, h0, xs, float64=True)):
            np.testing.assert_allclose(g, r, rtol=1e-12)
        per[n] = _counts(cp, f, (w, h0, xs))
    step = {k: per[4].get(k, 0) - per[3].get(k, 0) for k in per[4]}
    assert step.get("launches", 0) >= 1  # the body's kernels run every step
    for k in ("host_to_device", "device_to_host", "allocations"):
        assert per[3].get(k, 0) == per[4].get(k, 0) == per[7].get(k, 0), (k, per)
    # h is both the carry and the y: written into its row of ys, read there: no copy a step
    assert per[7].get("device_copies", 0) == per[3].get("device_copies", 0), per
    assert per[7]["launches"] - per[3]["launches"] == 4 * step["launches"]


def test_the_python_driver_copies_per_step_where_the_executor_does_not(cp, monkeypatch):
    """The figure the executor removes: the Python driver's per-step allocations and copies."""

    def rnn(w, h0, xs):
        return dq.scan(lambda h, x: (dq.tanh(h @ w + x),) * 2, h0, xs)

    rng = np.random.default_rng(2)
    w, h0 = rng.standard_normal((3, 3)) * 0.5, rng.standard_normal((2, 3))
    xs3, xs7 = rng.standard_normal((3, 2, 3)), rng.standard_normal((7, 2, 3))
    fast = [_counts(cp, compiled(rnn, w, h0, x)[0], (w, h0, x)) for x in (xs3, xs7)]
    monkeypatch.setattr(gpu_loop, "gpu_scan", lambda *a: "off in this test")
    slow3, slow7 = [_counts(cp, compiled(rnn, w, h0, x)[0], (w, h0, x)) for x in (xs3, xs7)]
    assert slow7["allocations"] - slow3["allocations"] >= 4  # a body call's buffers per step
    assert fast[1]["allocations"] == fast[0]["allocations"]


def newton(a, x0):
    def body(c):
        nx = 0.5 * (c[0] + a / c[0])
        return nx, nx - c[0]

    return dq.while_loop(lambda c: dq.max(dq.abs(c[1])) > 1e-9, body, (x0, x0))[0]


def test_a_while_loop_reads_its_condition_once_a_step_and_nothing_else(cp):
    rng = np.random.default_rng(3)
    x0 = np.ones((2, 3))
    f, m, name = compiled(newton, rng.uniform(1, 9, (2, 3)), x0)
    assert f.report.drivers == [EXECUTOR]
    reads = {}
    for hi in (1.5, 900.0):  # more Newton steps for larger values
        a = rng.uniform(1.0, hi, (2, 3))
        got = on_gpu(cp, f, a, x0)[0]
        np.testing.assert_allclose(got, interpret(m, name, a, x0, float64=True), rtol=1e-12)
        np.testing.assert_allclose(got, np.sqrt(a), rtol=1e-12)
        c = _counts(cp, f, (a, x0))
        steps = _steps(a)
        assert c.get("allocations", 0) <= 8, c  # once per loop, not per step
        reads[hi] = (steps, c["device_to_host"])
        assert c["device_to_host"] == steps + 1, c  # one read of each test, the last failing
    (s1, r1), (s2, r2) = reads.values()
    assert s2 > s1 and r2 - r1 == s2 - s1, reads


def _steps(a) -> int:
    x, d, n = np.ones_like(a), np.ones_like(a), 0
    while np.max(np.abs(d)) > 1e-9:
        nx = 0.5 * (x + a / x)
        x, d, n = nx, nx - x, n + 1
    return n


# ------------------------------------------------------------------ random bodies

UNARY = [dq.tanh, dq.sin, lambda v: v * 0.5, lambda v: dq.sigmoid(v) - 0.5]


def random_program(kind: str, op: int, reverse: bool):
    u = UNARY[op]

    def plain(w, h0, xs):
        def body(h, x):
            h2 = u(h @ w + x)
            return h2, h2 * x + h

        return dq.scan(body, h0, xs, reverse=reverse)

    def with_cond(w, h0, xs):
        def body(h, x):
            h2 = dq.cond(dq.sum(x) > 0.0, lambda v: u(v @ w), lambda v: v * 0.9 + x, h)
            return h2, dq.sum(h2 * h, axis=1)  # h read after the branch wrote h2

        return dq.scan(body, h0, xs, reverse=reverse)

    def nested(w, h0, xs):
        def inner(g, x):
            return u(g @ w) + x, g

        def outer(h, x):
            g, gs = dq.scan(inner, h, dq.stack([x, x * 0.5, -x]), reverse=reverse)
            return g + h * 0.25, dq.sum(gs, axis=0)

        return dq.scan(outer, h0, xs)

    def carried_pair(w, h0, xs):
        def body(c, x):
            a, b = c
            return (b, u(a @ w) + x), a - b  # the carries swap: results read the other's input

        return dq.scan(body, (h0, h0 * 2.0), xs, reverse=reverse)

    return {"plain": plain, "cond": with_cond, "nested": nested, "pair": carried_pair}[kind]


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@example(kind="pair", op=0, reverse=True, n=5, seed=1)
@example(kind="nested", op=1, reverse=True, n=2, seed=2)
@example(kind="cond", op=2, reverse=False, n=5, seed=3)
@example(kind="plain", op=3, reverse=True, n=5, seed=4)
@given(
    kind=st.sampled_from(["plain", "cond", "nested", "pair"]),
    op=st.integers(0, len(UNARY) - 1),
    reverse=st.booleans(),
    n=st.sampled_from([0, 1, 2, 5]),
    seed=st.integers(0, 2**16),
)
def test_random_loop_bodies_on_gpu_equal_cpu_and_the_interpreter(cp, kind, op, reverse, n, seed):
    f = random_program(kind, op, reverse)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((3, 3)) * 0.5
    h0, xs = rng.standard_normal((2, 3)), rng.standard_normal((n, 2, 3))
    gpu, m, name = compiled(f, w, h0, xs)
    cpu, _, _ = compiled(f, w, h0, xs, target="cpu")
    if n != 1:  # (n = 1 inlines)
        assert gpu.report.drivers == [EXECUTOR], gpu.report.drivers
    got = on_gpu(cp, gpu, w, h0, xs)
    want = interpret(m, name, w, h0, xs, float64=True)
    on_cpu = dq.tree_leaves(cpu(w, h0, xs))
    assert len(got) == len(want) == len(on_cpu)
    for g, r, c in zip(got, want, on_cpu):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(g, c, rtol=1e-10, atol=1e-12)


def test_an_out_of_range_id_in_a_scan_body_is_the_interpreters_error(cp):
    def f(table, h0, ids):
        return dq.scan(lambda h, i: (h + dq.take(table, i, axis=0),) * 2, h0, ids)

    table = np.arange(12.0).reshape(4, 3)
    h0 = np.zeros((2, 3))
    ok = np.array([[0, 1], [3, 2], [1, 1]], np.int32)
    gpu, m, name = compiled(f, table, h0, ok)
    got = on_gpu(cp, gpu, table, h0, ok)
    for g, r in zip(got, interpret(m, name, table, h0, ok, float64=True)):
        np.testing.assert_allclose(g, r)
    bad = ok.copy()
    bad[1, 0] = 4
    with pytest.raises(dq.DlvmError) as want:
        interpret(m, name, table, h0, bad)
    with pytest.raises(dq.DlvmError) as e:
        on_gpu(cp, gpu, table, h0, bad)
    assert str(e.value) == str(want.value)


@pytest.mark.parametrize("kind", ["pair", "plain", "nested"])
def test_copied_carries_and_ys_give_the_same_results_as_moved_ones(cp, kind, monkeypatch):
    """The planner gives every result a buffer of its own, so carries and ys move by pointer;
    the copies (a result that is a view or shared) are forced here, for the same results."""
    f = random_program(kind, 0, True)
    rng = np.random.default_rng(5)
    w, h0, xs = (
        rng.standard_normal((3, 3)) * 0.5,
        rng.standard_normal((2, 3)),
        rng.standard_normal((5, 2, 3)),
    )
    moved = on_gpu(cp, compiled(f, w, h0, xs)[0], w, h0, xs)
    real = gpu_loop._carry_modes

    def copies(prog, nc):
        carries, ys = real(prog, nc)
        return [("copy",)] * len(carries), ["copy"] * len(ys)

    monkeypatch.setattr(gpu_loop, "_carry_modes", copies)
    cp.record.clear()
    copied = on_gpu(cp, compiled(f, w, h0, xs)[0], w, h0, xs)
    assert cp.record["device_copies"] >= 5  # (the forced copies ran)
    for a, b in zip(moved, copied):
        np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["gru", "lstm"])
def test_rnn_value_and_gradient_on_a_gpu_equal_the_interpreter(model):
    """The same as the emulated test, on a real device (scripts/gpu-check runs it)."""
    from dlvm_eq.codegen.gpu.gpu_runtime import cupy_module, gpu_available

    if not gpu_available():
        pytest.skip("no usable CUDA device")
    real = cupy_module()
    loss = gru_loss if model == "gru" else lstm_loss
    p, h0, xs = rnn_args(64, hidden=32, gates="zrh" if model == "gru" else "ifog")
    args = (p, h0, xs) if model == "gru" else (p, (h0, np.tanh(h0)), xs)
    f, m, name = compiled(dq.value_and_grad(loss, argnums=(0, 2)), *args)
    assert set(f.report.drivers) == {EXECUTOR}, f.report.drivers
    leaves = dq.tree_leaves(args)
    got = f(*[real.asarray(a) for a in leaves])
    want = interpret(m, name, *leaves, float64=True)
    for g, w in zip(dq.tree_leaves(got), want):
        np.testing.assert_allclose(real.asnumpy(g), w, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("per_sync", [2, 4])
def test_a_while_loop_read_once_per_batch_of_steps_gives_the_same_bits(cp, monkeypatch, per_sync):
    rng = np.random.default_rng(7)
    x0 = np.ones((2, 3))
    f, m, name = compiled(newton, rng.uniform(1, 9, (2, 3)), x0)
    for hi in (1.5, 50.0, 900.0):
        a = rng.uniform(1.0, hi, (2, 3))
        monkeypatch.setattr(gpu_loop, "STEPS_PER_SYNC", 1)
        one = on_gpu(cp, f, a, x0)[0]
        monkeypatch.setattr(gpu_loop, "STEPS_PER_SYNC", per_sync)
        c = _counts(cp, f, (a, x0))
        batched = on_gpu(cp, f, a, x0)[0]
        np.testing.assert_array_equal(batched, one)
        np.testing.assert_allclose(batched, interpret(m, name, a, x0, float64=True), rtol=1e-12)
        tests = _steps(a) + 1  # the last one fails
        assert c["device_to_host"] == -(-tests // per_sync), (c, tests)


@pytest.mark.parametrize("n", [0, 3, 5])
def test_steps_run_past_the_end_of_a_batch_keep_their_carries(cp, monkeypatch, n):
    def fori(a, h0, n):
        return dq.fori_loop(0, n, lambda i, h: dq.tanh(h @ a) + dq.astype(i, h.dtype) * 0.1, h0)

    rng = np.random.default_rng(8)
    a, h0 = rng.standard_normal((4, 4)) * 0.5, rng.standard_normal((3, 4))
    f, m, name = compiled(fori, a, h0, np.int32(n))
    assert f.report.drivers == [EXECUTOR], f.report.drivers
    want = interpret(m, name, a, h0, np.int32(n), float64=True)
    monkeypatch.setattr(gpu_loop, "STEPS_PER_SYNC", 4)
    got = on_gpu(cp, f, a, h0, np.int32(n))[0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_a_cond_in_a_scan_reads_its_predicate_once_a_step_and_allocates_nothing(cp):
    f = random_program("cond", 0, False)
    rng = np.random.default_rng(9)
    w, h0 = rng.standard_normal((3, 3)) * 0.5, rng.standard_normal((2, 3))
    per = {}
    for n in (3, 6):
        xs = rng.standard_normal((n, 2, 3))
        g, m, name = compiled(f, w, h0, xs)
        assert g.report.drivers == [EXECUTOR], g.report.drivers
        on_gpu(cp, g, w, h0, xs)  # (kernels loaded)
        per[n] = _counts(cp, g, (w, h0, xs))
        for a, b in zip(on_gpu(cp, g, w, h0, xs), interpret(m, name, w, h0, xs, float64=True)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert per[6]["device_to_host"] - per[3]["device_to_host"] == 3, per  # the predicate
    for k in ("host_to_device", "allocations"):
        assert per[6].get(k, 0) == per[3].get(k, 0), (k, per)
