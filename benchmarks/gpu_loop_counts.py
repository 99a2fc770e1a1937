"""What one more loop step costs on the gpu target, counted on the emulated GPU
(tests/fake_cupy.py's `record`), the gpu executor (codegen/execution/gpu_loop.py) against the
Python driver (pipeline/loops.py): our kernels' launches, CuPy's calls (cuBLAS products,
concatenations: launches too), host-to-device transfers, device-to-host
reads (each a synchronization on a real GPU), device copies and allocations. Counts, not
times: the emulator runs every launch on the host, so its times say nothing of a GPU.

    PYTHONPATH=. python benchmarks/gpu_loop_counts.py            # a markdown table
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fake_cupy
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.execution import gpu_flow, gpu_loop
from dlvm_eq.pipeline.loops import compile_loops

KEYS = [
    "launches",
    "library_calls",
    "host_to_device",
    "device_to_host",
    "device_copies",
    "allocations",
]


def gru_grad(w, u, h0, xs):
    def loss(w, u):
        def cell(h, x):
            z = dq.sigmoid(x @ w[0] + h @ u[0])
            r = dq.sigmoid(x @ w[1] + h @ u[1])
            c = dq.tanh(x @ w[2] + (r * h) @ u[2])
            h = (1.0 - z) * h + z * c
            return h, h

        h, ys = dq.scan(cell, h0, xs)
        return dq.mean(ys * ys) + dq.sum(h)

    return dq.value_and_grad(loss, argnums=(0, 1))(w, u)


def newton(a, x0):
    def body(c):
        nx = 0.5 * (c[0] + a / c[0])
        return nx, nx - c[0]

    return dq.while_loop(lambda c: dq.max(dq.abs(c[1])) > 1e-9, body, (x0, x0))[0]


def bounded_newton(a, x0):
    """The same loop with max_steps: a scan whose body is a cond (gpu_flow.py)."""

    def body(c):
        nx = 0.5 * (c[0] + a / c[0])
        return nx, nx - c[0]

    test = lambda c: dq.max(dq.abs(c[1])) > 1e-9
    return dq.while_loop(test, body, (x0, x0), max_steps=a.shape[0] * 4)[0]


def bounded_rows(cp) -> tuple[list, str]:
    x0, a = np.ones((2, 3)), np.full((2, 3), 7.0)
    got = {}
    for n in (4, 8):  # max_steps = 4 n
        a_n, x_n = np.full((n, 3), 7.0), np.ones((n, 3))
        m = dq.make_ir(bounded_newton)(a_n, x_n)
        f = compile_loops(m, next(iter(m.functions)), "gpu")
        got[n] = counts(cp, f, (a_n, x_n))
    del x0, a
    step = [(got[8][k] - got[4][k]) / 16 for k in KEYS]
    return step, f"Newton while_loop(max_steps=), a scan with a cond ({f.report.drivers})"


def counts(cp, f, args) -> dict:
    f(*[cp.asarray(a) for a in args])  # (first call: kernels loaded)
    cp.record.clear()
    out = f(*[cp.asarray(a) for a in args])
    del out
    return {k: cp.record.get(k, 0) for k in KEYS}


def scan_rows(cp) -> tuple[list, str]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 3, 4)) * 0.4
    u = rng.standard_normal((3, 4, 4)) * 0.4
    h0 = rng.standard_normal((2, 4)) * 0.1
    per = {}
    for n in (4, 8):
        xs = rng.standard_normal((n, 2, 3))
        m = dq.make_ir(gru_grad)(w, u, h0, xs)
        f = compile_loops(m, next(iter(m.functions)), "gpu")
        per[n] = counts(cp, f, (w, u, h0, xs))
    loops = len(f.report.drivers)  # forward and backward scans: 2 steps each per time step
    step = [(per[8][k] - per[4][k]) / 4 for k in KEYS]
    return step, f"GRU value_and_grad, batch 2, hidden 4 ({loops} scans: {f.report.drivers})"


def while_rows(cp) -> tuple[list, str]:
    x0 = np.ones((2, 3))
    m = dq.make_ir(newton)(np.full((2, 3), 2.0), x0)
    f = compile_loops(m, next(iter(m.functions)), "gpu")
    got = {}
    for v in (2.0, 5.0, 20.0, 100.0, 900.0, 1e4, 1e6, 1e8):
        a = np.full((2, 3), v)
        x, d, n = np.ones_like(a), np.ones_like(a), 0
        while np.max(np.abs(d)) > 1e-9:
            nx = 0.5 * (x + a / x)
            x, d, n = nx, nx - x, n + 1
        got.setdefault(n, a)
    # two loops whose steps differ by a multiple of 4: whole batches of STEPS_PER_SYNC = 4
    n1, n2 = max(
        ((p, q) for p in got for q in got if q > p and (q - p) % 4 == 0), key=lambda t: t[1] - t[0]
    )
    c1, c2 = counts(cp, f, (got[n1], x0)), counts(cp, f, (got[n2], x0))
    step = [(c2[k] - c1[k]) / (n2 - n1) for k in KEYS]
    return step, f"Newton while_loop, {n1} against {n2} steps ({f.report.drivers})"


def main() -> None:
    mp = pytest.MonkeyPatch()
    import tempfile

    set_cache_dir(tempfile.mkdtemp())
    rows = []
    with fake_cupy.installed(mp, sms=1) as cp:
        step, what = scan_rows(cp)
        rows.append(("gpu executor", what, step))
        step, what = while_rows(cp)
        rows.append(("gpu executor", what, step))
        mp.setattr(gpu_loop, "STEPS_PER_SYNC", 4)
        step, what = while_rows(cp)
        rows.append(("gpu executor, STEPS_PER_SYNC = 4", what, step))
        mp.setattr(gpu_loop, "STEPS_PER_SYNC", 1)
        step, what = bounded_rows(cp)
        rows.append(("gpu executor", what, step))
        mp.setattr(gpu_loop, "gpu_scan", lambda *a: "the Python driver (for this table)")
        mp.setattr(gpu_loop, "gpu_while", lambda *a: "the Python driver (for this table)")
        step, what = scan_rows(cp)
        rows.append(("Python driver", what, step))
        step, what = while_rows(cp)
        rows.append(("Python driver", what, step))
        mp.setattr(gpu_flow, "gpu_flow_scan", lambda *a: "the Python driver (for this table)")
        step, what = bounded_rows(cp)
        rows.append(("Python driver", what, step))
    mp.undo()
    print("| driver | loop | " + " | ".join(KEYS) + " |")
    print("|---" * (2 + len(KEYS)) + "|")
    for driver, what, step in rows:
        print(f"| {driver} | {what} | " + " | ".join(f"{v:g}" for v in step) + " |")
    print("\nper time step (a scan row counts the forward and the backward scan's step)")


if __name__ == "__main__":
    main()
