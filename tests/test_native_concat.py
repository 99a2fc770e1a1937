"""A scan body's concatenation on the native loop driver (planning/loop_plan.py: a COPY record
per part, written through the output's row stride; runtime/loop_driver.py's COPY arg 7):
the driver's copy into strided rows against numpy, and scan bodies that concatenate along
each axis (parts read in place, transposed or sliced) against the interpreter and,
bit for bit, the Python driver, with `report.drivers` saying the native one ran (issue 30:
the LSTM's adjoint at hidden 64 merged its products through a concatenation and fell back)."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen.execution.native_loop import drive
from dlvm_eq.codegen.runtime.loop_driver import COPY, WORDS, loop_driver
from dlvm_eq.ir.interp import interpret
from tests.test_native_loop import close, compiled

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("transposed", [False, True])
def test_the_drivers_copy_writes_through_the_destination_row_stride(transposed):
    steps, rows, cols, wide = 3, 4, 5, 9
    src = RNG.standard_normal((steps, cols, rows) if transposed else (steps, rows, cols))
    src = src.astype(np.float32)
    dst = np.zeros((steps, rows, wide), np.float32)
    es = 4
    rs, cs = (es, rows * es) if transposed else (cols * es, es)
    rec = np.zeros((1, WORDS), np.int64)
    rec[0, :10] = [COPY, 0, 0, 0, rows, cols, rs, cs, es, wide * es]
    patches = [
        (rec.ctypes.data + 2 * 8, dst.ctypes.data + 2 * es, dst.strides[0], 0),  # column 2 on
        (rec.ctypes.data + 3 * 8, src.ctypes.data, src.strides[0], 0),
    ]
    drive(loop_driver(), rec, patches, steps, False)
    want = np.zeros_like(dst)
    want[:, :, 2 : 2 + cols] = src.transpose(0, 2, 1) if transposed else src
    np.testing.assert_array_equal(dst, want)


def _body(axis):
    def f(w, h0, xs):
        def step(h, x):
            a = dq.tanh(h @ w)
            parts = (a, x * 2.0, dq.transpose(h)[:, : h.shape[0]]) if axis == 1 else (a, x, h)
            y = dq.concatenate(parts, axis=axis)
            return a + 0.5 * h, y

        return dq.scan(step, h0, xs)

    return f


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("steps", [0, 3])
def test_a_body_that_concatenates_runs_natively_and_equals_the_interpreter(
    axis, steps, monkeypatch
):
    n = 4
    w = (RNG.standard_normal((n, n)) * 0.5).astype(np.float32)
    h0 = RNG.standard_normal((n, n)).astype(np.float32)
    xs = RNG.standard_normal((steps, n, n)).astype(np.float32)
    f, m = compiled(_body(axis), w, h0, xs)
    assert set(f.report.drivers) == {"native"}, f.report.drivers
    got = f(w, h0, xs)
    want = interpret(m, f.name, w.astype(np.float64), h0.astype(np.float64), xs.astype(np.float64))
    for g, v in zip(got, want):
        close(g, v, f64=False)
    slow, _ = compiled(_body(axis), w, h0, xs, native=False, monkeypatch=monkeypatch)
    for a, b in zip(slow(w, h0, xs), got):
        np.testing.assert_array_equal(a, b)
