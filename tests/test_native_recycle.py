"""A native scan's stacked ys are reused by its next call once nothing else holds them
(codegen/execution/native_loop.Recycled, issue 30: glibc returned each call's 12 MiB of ys to
the OS, and the LSTM's fresh-process step paid ~3 ms of page faults): an array the caller
still holds, or whose memory a view still reads, is never written again; a dropped one is."""

from __future__ import annotations

import numpy as np

import dlvm_eq as dq
from dlvm_eq.codegen.execution.native_loop import RECYCLE_BYTES, Recycled
from dlvm_eq.ir.interp import interpret
from tests.test_native_loop import close, compiled

RNG = np.random.default_rng(16)


def test_recycled_arrays_are_reused_only_when_nothing_else_holds_them():
    r = Recycled()
    shape = (RECYCLE_BYTES // 4,)
    a = r.take(shape, np.float32)
    r.keep([a])
    b = r.take(shape, np.float32)
    assert b is not a  # the caller holds a
    r.keep([a, b])
    view = a[3:]
    del a, b
    c = r.take(shape, np.float32)  # b is free; a is read through a view
    d = r.take(shape, np.float32)
    assert c.base is not view.base and d.base is not view.base
    assert sum(x.base is y.base for x in (c, d) for y in (c, d)) == 2  # two distinct buffers
    small = r.take((4,), np.float32)
    r.keep([small])
    assert r.arrays == []  # small arrays come from malloc's own free lists


def _scan(w, h0, xs):
    def step(h, x):
        h = dq.tanh(h @ w + x)
        return h, h * 2.0

    return dq.scan(step, h0, xs)


def test_a_held_result_is_never_overwritten_and_a_dropped_one_is_reused():
    n, steps = 128, 8  # ys: 8 x 16 x 128 floats, 64 KiB
    w = (RNG.standard_normal((n, n)) * 0.1).astype(np.float32)
    h0 = RNG.standard_normal((16, n)).astype(np.float32)
    xs1, xs2 = (RNG.standard_normal((steps, 16, n)).astype(np.float32) for _ in range(2))
    f, m = compiled(_scan, w, h0, xs1)
    assert set(f.report.drivers) == {"native"}, f.report.drivers
    want1, want2 = (interpret(m, f.name, w, h0, xs) for xs in (xs1, xs2))
    first = f(w, h0, xs1)[1]
    kept = first.copy()
    second = f(w, h0, xs2)[1]
    np.testing.assert_array_equal(first, kept)  # held by the caller: not written again
    close(first, want1[1], f64=False)
    close(second, want2[1], f64=False)
    address = second.__array_interface__["data"][0]
    del second
    third = f(w, h0, xs1)[1]
    assert third.__array_interface__["data"][0] == address  # dropped: its memory reused
    np.testing.assert_array_equal(third, kept)


def test_threads_calling_one_scan_never_share_its_recycled_ys():
    """8 threads call one compiled scan at once, each on its own xs, 6 calls each, dropping
    some results and keeping others: each result equals the interpreter's for its own xs (a
    ys buffer handed to two calls at once would mix their rows)."""
    import threading

    n, steps = 128, 8
    w = (RNG.standard_normal((n, n)) * 0.1).astype(np.float32)
    h0 = RNG.standard_normal((16, n)).astype(np.float32)
    inputs = [RNG.standard_normal((steps, 16, n)).astype(np.float32) for _ in range(8)]
    f, m = compiled(_scan, w, h0, inputs[0])
    assert set(f.report.drivers) == {"native"}, f.report.drivers
    wants = [interpret(m, f.name, w, h0, xs)[1] for xs in inputs]
    kept: list[list] = [[] for _ in inputs]
    barrier, errors = threading.Barrier(len(inputs)), []

    def calls(i: int) -> None:
        barrier.wait()
        try:
            for j in range(6):
                ys = f(w, h0, inputs[i])[1]
                if j % 2 == 0:
                    kept[i].append(ys)  # held: must never be written again
                else:
                    close(ys, wants[i], f64=False)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=calls, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert all(len(k) == 3 for k in kept)
    for i, results in enumerate(kept):
        for ys in results:
            close(ys, wants[i], f64=False)
