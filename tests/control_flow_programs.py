"""Small programs with control flow (tests/data/control_flow/loops.dl) and their numpy
references, shared by the IR, interpreter and compile tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dlvm_eq.ir import interpret
from dlvm_eq.ir.parser import load

LOOPS = Path(__file__).parent / "data" / "control_flow" / "loops.dl"


def loops_module():
    return load(LOOPS)


def ref_main(h, xs, w):
    """@main: a reverse tanh RNN over 8 steps, every step's state stacked."""
    ys = [None] * len(xs)
    for t in reversed(range(len(xs))):
        h = np.tanh(xs[t] @ w + h)
        ys[t] = h
    return h, np.stack(ys)


def ref_loop(h):
    i = 0
    while i < 5:
        i, h = i + 1, h * 2
    return np.int32(i), h


def ref_pick(p, k, x):
    y = -x if p else np.exp(x)
    return [-y, np.exp(y), -y][int(np.clip(k, 0, 2))]


def check_interp_op(op: str) -> None:
    """The interpreter runs `op` (scan, while, cond, switch) as its numpy reference does."""
    m = loops_module()
    rng = np.random.default_rng(len(op))
    h = rng.standard_normal(4).astype(np.float32)
    if op == "scan":
        xs, w = rng.standard_normal((8, 3)).astype(np.float32), rng.standard_normal((3, 4))
        w = w.astype(np.float32)
        got, want = interpret(m, "main", h, xs, w), ref_main(h, xs, w)
    elif op == "while":
        got, want = interpret(m, "loop", h), ref_loop(h)
    else:
        cases = [(p, k) for p in (True, False) for k in (-1, 0, 1, 2, 5)]
        got = [interpret(m, "pick", np.bool_(p), np.int32(k), h) for p, k in cases]
        want = [ref_pick(p, k, h) for p, k in cases]
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=2e-6, atol=1e-6)
