"""Each examples/*.py script runs as a newcomer runs it (`python examples/NAME.py`, a fresh
process) and prints what it claims: the optimizer's effect, and training that works."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, tmp_path) -> str:
    env = dict(os.environ, PYTHONIOENCODING="utf-8", DLVM_EQ_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def losses(out: str) -> list[float]:
    return [float(v) for v in re.findall(r"^\s+step\s+\d+\s+loss ([0-9.]+)$", out, re.M)]


def target_ran(out: str) -> str:
    m = re.search(r"on target '(\w+)'", out)
    assert m, "the example does not say which target ran"
    return m.group(1)


def test_logistic_regression(tmp_path):
    out = run_example("logistic_regression.py", tmp_path)
    assert "== gradient wrt (w, b): adjoint rules alone -> dq.optimize ==" in out
    assert target_ran(out) in ("cpu", "interp")
    curve = losses(out)
    assert curve[0] == pytest.approx(np.log(2), abs=1e-4) and curve[-1] < 0.5 * curve[0]
    assert float(re.search(r"train accuracy: ([0-9.]+)%", out).group(1)) >= 90.0


def test_mlp(tmp_path):
    out = run_example("mlp.py", tmp_path)
    assert re.search(r"instructions: \d+ -> \d+", out)
    rel = float(re.search(r"largest relative difference ([0-9.e+-]+)", out).group(1))
    assert rel < 1e-4
    curve = losses(out)
    assert curve[-1] < 0.5 * curve[0]


def test_rnn_gradient_matches_finite_differences(tmp_path):
    out = run_example("rnn.py", tmp_path)
    assert "8 time steps unrolled into" in out and "(8 tanh)" in out
    checks = re.findall(
        r"d loss / d (\w+)\s*: compiled ([+-][0-9.]+)\s+finite differences ([+-][0-9.]+)", out
    )
    assert [c[0] for c in checks] == ["wx", "wh", "b", "wo"]
    for _, got, expected in checks:
        assert float(got) == pytest.approx(float(expected), rel=1e-3, abs=1e-3)
    curve = losses(out)
    assert curve[-1] < 0.1 * curve[0]


def test_scan_rnn_is_one_scan_and_its_gradient_matches_finite_differences(tmp_path):
    out = run_example("scan_rnn.py", tmp_path)
    assert "64 time steps as 1 scan op (1 tanh in the IR)" in out
    checks = re.findall(
        r"d loss / d (\w+)\s*: compiled ([+-][0-9.]+)\s+finite differences ([+-][0-9.]+)", out
    )
    assert [c[0] for c in checks] == ["wx", "wh", "b", "wo"]
    for _, got, expected in checks:
        assert float(got) == pytest.approx(float(expected), rel=1e-3, abs=1e-4)
    curve = losses(out)
    assert curve[-1] < 0.1 * curve[0]


def test_least_squares_avoids_materializing_uvt(tmp_path):
    out = run_example("least_squares.py", tmp_path)
    assert "matmul results before: 1000x800" in out
    assert "U Vᵀ (1000x800) materialized after optimization: no" in out
    before, after = map(
        float, re.search(r"cost before: ([0-9.]+) us, cost after: ([0-9.]+) us", out).groups()
    )
    assert after < before

    # in float64 the expansion is accurate; in float32 it is not applied
    for error in re.findall(r"relative error ([0-9.e+-]+)", out):
        assert float(error) < 1e-6
    assert "float32: the expansion is not applied (it would cancel); U Vᵀ materialized: yes" in out


def test_lstm_gates_are_slices_and_training_works(tmp_path):
    out = run_example("lstm.py", tmp_path)
    assert "6 time steps unrolled into" in out and "(24 slices, 7 dot)" in out
    assert "== gradient wrt w, b, wo: adjoint rules alone -> dq.optimize ==" in out
    checks = re.findall(
        r"d loss / d (\w+)\s*: compiled ([+-][0-9.]+)\s+finite differences ([+-][0-9.]+)", out
    )
    assert [c[0] for c in checks] == ["w", "b", "wo"]
    for _, got, expected in checks:
        assert float(got) == pytest.approx(float(expected), rel=1e-3, abs=1e-5)
    curve = losses(out)
    assert target_ran(out) == "cpu" and curve[-1] < 0.5 * curve[0]
