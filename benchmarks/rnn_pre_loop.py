"""What the piece before an RNN's loops costs (the weight concatenations the loop rules lift
out of the body, rules/loops.egg's once-concatenate) and what packing B costs (the loop
driver's pack_withs, codegen/execution/packed_products.py), against the whole call: CPU time,
in one process, for benchmarks/rnn.py's LSTM or GRU value and gradient.

    OPENBLAS_NUM_THREADS=1 DLVM_EQ_NUM_THREADS=1 python benchmarks/rnn_pre_loop.py lstm
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]  # this tree's dlvm_eq, not an installed one
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
import rnn  # noqa: E402

import dlvm_eq as dq  # noqa: E402
from dlvm_eq.codegen.execution import native_loop  # noqa: E402
from dlvm_eq.dsl.pytree import tree_leaves  # noqa: E402


def _cpu_ms(f, n: int) -> float:
    ts = []
    for _ in range(n):
        t = time.process_time()
        f()
        ts.append(time.process_time() - t)
    return 1e3 * float(np.median(ts))


def main(cell: str = "lstm", hidden: int = 256, steps: int = 64) -> None:
    p, h0, xs = rnn._data(steps, cell, hidden)
    step = rnn._step(dq, dq.sigmoid, cell)

    def loss(p, h0, xs):
        _, ys = dq.scan(step(p), rnn._init(cell, h0), xs)
        return dq.mean(ys * ys)

    m = dq.make_ir(dq.value_and_grad(loss))(p, h0, xs)
    name = next(iter(m.functions))
    prog = dq.compile(m, name)
    args = tree_leaves((p, h0, xs))
    vals = {id(q): a for q, a in zip(prog._params, args)}
    run, ops, outs, _ = prog._steps[0]  # the straight piece before the first scan
    inputs = [vals[id(o)] for o in ops]
    print(f"{cell} h{hidden} T={steps}: piece 0 gives {[tuple(o.type.shape) for o in outs]}")
    for _ in range(3):
        prog(*args)
    for _ in range(3):
        whole = _cpu_ms(lambda: prog(*args), 20)
        piece = _cpu_ms(lambda: run(*inputs), 200)
        print(
            f"load {os.getloadavg()[0]:.1f}: call {whole:.2f} ms CPU, piece 0 {piece * 1e3:.1f} us"
            f" ({piece / whole * 100:.2f}%)"
        )
    real, spent = native_loop.pack_withs, []

    def timed(*a):
        t = time.process_time()
        real(*a)
        spent.append(time.process_time() - t)

    native_loop.pack_withs = timed
    for _ in range(30):
        prog(*args)
    if spent:
        print(
            f"packing B: {1e6 * float(np.median(spent)):.1f} us CPU a pack_withs, "
            f"{len(spent) // 30} a call"
        )


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["lstm"]))
