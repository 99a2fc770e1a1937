"""A while loop whose body reads an invariant product (tanh(W @ V), W 256x256, V 256x64):
CPU seconds a call of the compiled function (one thread), for comparing trees before and
after loop motion out of while loops (tests/test_while_motion.py checks the motion itself).

    PYTHONPATH=. python benchmarks/while_motion.py [steps]
"""

from __future__ import annotations

import sys
import time

import numpy as np

import dlvm_eq as dq


def f(w, v, h0, n):
    def body(c):
        i, h = c
        return i + 1, h * 0.5 + dq.tanh(w @ v)

    return dq.while_loop(lambda c: c[0] < n, body, (0, h0))[1]


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    rng = np.random.default_rng(0)
    args = (
        rng.standard_normal((256, 256)).astype(np.float32),
        rng.standard_normal((256, 64)).astype(np.float32),
        rng.standard_normal((256, 64)).astype(np.float32),
        np.int32(steps),
    )
    g = dq.jit(f)
    g(*args)
    times = []
    for _ in range(15):
        t = time.process_time()
        g(*args)
        times.append(time.process_time() - t)
    print(f"while loop, {steps} steps: median {np.median(times) * 1e3:.2f} ms CPU a call")


if __name__ == "__main__":
    main()
