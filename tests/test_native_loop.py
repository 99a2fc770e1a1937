"""Scans on the native loop driver (codegen/execution/native_loop.py): every step in one native
call. Each result is checked against the reference interpreter (float64 where it matters) and
against the Python driver; `report.drivers` says which driver ran each scan, so a test of the
native path fails if the scan silently fell back to Python."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.codegen.planning.loop_plan import CALL, Ptr, loop_plan
from dlvm_eq.ir.interp import interpret
from dlvm_eq.pipeline import loops
from dlvm_eq.pipeline.loops import compile_loops


def compiled(f, *args, native=True, monkeypatch=None):
    """(the cpu program of f on the loop drivers, the IR module, the function's name)"""
    m = dq.make_ir(f)(*args)
    name = next(iter(m.functions))
    if monkeypatch is not None:
        monkeypatch.setattr(loops, "NATIVE_LOOPS", native)
    prog = compile_loops(m, name, "cpu")
    prog.name = name
    return prog, m


def close(got, want, f64: bool):
    """float64 programs: near the interpreter's bits; float32: relative to the largest entry."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    tol = 1e-10 if f64 else 1e-4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def gru_loss(p, h0, xs):
    def cell(h, x):
        z = dq.sigmoid(x @ p["wz"] + h @ p["uz"])
        r = dq.sigmoid(x @ p["wr"] + h @ p["ur"])
        c = dq.tanh(x @ p["wh"] + (r * h) @ p["uh"])
        h = (1.0 - z) * h + z * c
        return h, h

    h, ys = dq.scan(cell, h0, xs)
    return dq.mean(ys * ys) + dq.sum(h)


def gru_args(steps, dtype=np.float32, batch=4, inputs=3, hidden=5, seed=0):
    rng = np.random.default_rng(seed)
    p = {}
    for g in "zrh":
        p[f"w{g}"] = (rng.standard_normal((inputs, hidden)) * 0.4).astype(dtype)
        p[f"u{g}"] = (rng.standard_normal((hidden, hidden)) * 0.4).astype(dtype)
    h0 = (rng.standard_normal((batch, hidden)) * 0.1).astype(dtype)
    xs = rng.standard_normal((steps, batch, inputs)).astype(dtype)
    return p, h0, xs


@pytest.mark.parametrize("steps", [0, 2, 7])  # (a scan of length 1 is inlined)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gru_value_and_gradient_run_natively_and_equal_the_interpreter(steps, dtype, monkeypatch):
    args = gru_args(steps, dtype)
    f, m = compiled(dq.value_and_grad(gru_loss), *args)
    assert f.report.drivers and set(f.report.drivers) == {"native"}, f.report.drivers
    leaves = dq.tree_leaves(args)
    got = f(*leaves)
    want = interpret(m, f.name, *[a.astype(np.float64) for a in leaves])
    assert len(got) == len(want) == 1 + 6
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4 if dtype == np.float32 else 1e-10)
    tol = dict(rtol=2e-4, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-9, atol=1e-12)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, **tol)
    slow, _ = compiled(dq.value_and_grad(gru_loss), *args, native=False, monkeypatch=monkeypatch)
    assert set(slow.report.drivers) == {"native loops are off"}
    for a, b in zip(slow(*leaves), got):
        np.testing.assert_array_equal(a, b)  # the same kernels in the same order


def test_loop_plan_is_data_and_compiles_nothing():
    from dlvm_eq.codegen.runtime.jit import JIT

    args = gru_args(3)
    f, _ = compiled(dq.value_and_grad(gru_loss), *args)
    f(*dq.tree_leaves(args))
    bodies = [r.plan for label, r in f.report.parts if label.endswith("= scan")]
    assert len(bodies) == 2  # the forward scan's body and its adjoint's
    body = bodies[0]
    before = dict(JIT.counters)
    lp = loop_plan(body, carries=1, xs=1)
    assert not isinstance(lp, str), lp
    assert dict(JIT.counters) == before
    kinds = {r.kind for r in lp.records}
    assert CALL in kinds and len(kinds) >= 2  # kernels and products (and copies)
    for r in lp.records:
        assert r.fn is None or isinstance(r.fn, tuple)
        assert all(isinstance(a, (int, Ptr, tuple)) for a in r.args)


def test_swapping_carries_fall_back_to_python_with_the_reason():
    def f(a, b, xs):
        return dq.scan(lambda c, x: ((c[1] + x, c[0]), None), (a, b), xs)[0]

    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3)).astype(np.float32), np.zeros((2, 3), np.float32)
    xs = rng.standard_normal((4, 2, 3)).astype(np.float32)
    prog, m = compiled(f, a, b, xs)
    got = prog(a, b, xs)
    want = interpret(m, prog.name, a, b, xs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    assert len(prog.report.drivers) == 1
    assert prog.report.drivers[0] in ("native", "carries that swap places")


def test_a_wrong_xs_shape_is_an_error_not_a_crash():
    from dlvm_eq.errors import DlvmError

    args = gru_args(4)
    f, _ = compiled(gru_loss, *args)
    assert f.report.drivers == ["native"]
    leaves = dq.tree_leaves(args)
    with pytest.raises(DlvmError):
        f(*leaves[:-1], leaves[-1][:, :2])


MATS = ["h @ w", "h.T-free", "x @ v", "tanh", "h * x2", "copyT"]


@st.composite
def matrix_bodies(draw):
    return {
        "ops": draw(st.lists(st.sampled_from(MATS), min_size=1, max_size=6)),
        "length": draw(st.sampled_from([0, 2, 9])),  # (length 1 is inlined)
        "reverse": draw(st.booleans()),
        "ys": draw(st.integers(0, 2)),
        "f64": draw(st.booleans()),
    }


def matrix_program(p):
    def f(h0, w, v, xs):
        def body(h, x):
            vals = [h]
            for op in p["ops"]:
                cur = vals[-1]
                if op == "h @ w":
                    vals.append(cur @ w)
                elif op == "h.T-free":  # a product with a transposed operand
                    vals.append(dq.transpose(dq.transpose(w) @ dq.transpose(cur)))
                elif op == "x @ v":
                    vals.append(cur + x @ v)
                elif op == "tanh":
                    vals.append(dq.tanh(cur))
                elif op == "h * x2":
                    vals.append(cur * (x @ v))
                else:
                    vals.append(dq.transpose(dq.transpose(cur) * 0.5))
            new = dq.tanh(vals[-1])
            ys = tuple(vals[-1 - k] * 1.0 for k in range(p["ys"]))
            return new, ys

        h, ys = dq.scan(body, h0, xs, reverse=p["reverse"])
        return (h,) + tuple(ys)

    return f


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(matrix_bodies(), st.integers(0, 2**16))
def test_random_matrix_bodies_equal_the_interpreter(p, seed):
    dt = np.float64 if p["f64"] else np.float32
    rng = np.random.default_rng(seed)
    h0 = rng.standard_normal((4, 6)).astype(dt)
    w = (rng.standard_normal((6, 6)) * 0.4).astype(dt)
    v = (rng.standard_normal((3, 6)) * 0.4).astype(dt)
    xs = rng.standard_normal((p["length"], 4, 3)).astype(dt)
    prog, m = compiled(matrix_program(p), h0, w, v, xs)
    assert prog.report.drivers == ["native"], prog.report.drivers
    got = prog(h0, w, v, xs)
    want = interpret(m, prog.name, h0, w, v, xs)
    tol = dict(rtol=1e-4, atol=1e-5) if dt == np.float32 else dict(rtol=1e-10, atol=1e-12)
    for g, wv in zip(got, want):
        assert g.shape == wv.shape
        np.testing.assert_allclose(g, wv, **tol)


_GEMM_BODIES = """
import sys
sys.path.insert(0, "tests")
import numpy as np, dlvm_eq as dq
from test_native_loop import compiled, gru_args, gru_loss
from dlvm_eq.ir.interp import interpret
args = gru_args(5, batch=16, inputs=32, hidden=256)
f, m = compiled(dq.value_and_grad(gru_loss), *args)
assert f.report.drivers == ["native", "native"], f.report.drivers
kinds = {type(s).__name__ for _, r in f.report.parts for s in r.plan.steps}
assert "GemmStep" in kinds, kinds
leaves = dq.tree_leaves(args)
want = interpret(m, f.name, *[a.astype(np.float64) for a in leaves])
for g, w in zip(f(*leaves), want):
    # float32 sums of 256 products, against float64: an error relative to the largest entry
    np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5 * max(1.0, float(np.abs(w).max())))
print("ok")
"""


def test_bodies_with_our_gemm_and_its_epilogue_run_natively():
    """With our GEMM on (DLVM_EQ_GEMM=1), a hidden-256 GRU's bodies plan GemmSteps (a product
    with a fused epilogue): the driver runs the product on BLAS, then the epilogue kernel."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, DLVM_EQ_GEMM="1", DLVM_EQ_EPILOGUES="1", PYTHONPATH=str(root))
    out = subprocess.run(
        [sys.executable, "-c", _GEMM_BODIES],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float32, np.float64])
def test_the_drivers_strided_copy_equals_numpy(dtype):
    """A COPY record of a transposed block (element by element: a load and a store for 4- and
    8-byte elements, memcpy for the others) equals numpy's transpose, at every step."""
    from dlvm_eq.codegen.execution.native_loop import drive
    from dlvm_eq.codegen.runtime.loop_driver import COPY, WORDS, loop_driver

    steps, rows, cols = 3, 5, 7
    src = np.arange(steps * rows * cols).astype(dtype).reshape(steps, rows, cols)
    dst = np.zeros((steps, cols, rows), dtype)
    es = src.itemsize
    rec = np.zeros((1, WORDS), np.int64)
    rec[0, :9] = [COPY, 0, 0, 0, cols, rows, es, cols * es, es]  # dst[j, i] = src[i, j]
    patches = [
        (rec.ctypes.data + 2 * 8, dst.ctypes.data, dst.strides[0], 0),
        (rec.ctypes.data + 3 * 8, src.ctypes.data, src.strides[0], 0),
    ]
    drive(loop_driver(), rec, patches, steps, False)
    np.testing.assert_array_equal(dst, src.transpose(0, 2, 1))
