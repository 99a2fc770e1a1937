"""The tanh-chain gradient (N times x = tanh(x * x + x) on 6 floats, then sum): one fresh
process's cold jit(grad) wall and CPU seconds, the per-call time (min of 5 x 2000 calls, us),
the plan's kernel count and compile phases. Run with an empty DLVM_EQ_CACHE_DIR, trees alternating:

    for t in /old /new; do DLVM_EQ_CACHE_DIR=$(mktemp -d) PYTHONPATH=$t \
        .venv/bin/python benchmarks/tanh_chain_split.py 30; done
"""

import sys
import time
import timeit

t0, c0 = time.perf_counter(), time.process_time()
import numpy as np  # noqa: E402  (imports are part of the cold compile timed)

import dlvm_eq as dq  # noqa: E402

depth = int(sys.argv[1])


def deep(x):
    for _ in range(depth):
        x = dq.tanh(x * x + x)
    return dq.sum(x)


f = dq.jit(dq.grad(deep))
x = np.linspace(-0.5, 0.5, 6).astype(np.float32)
f(x)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
run = min(timeit.repeat(lambda: f(x), number=2000, repeat=5)) / 2000
r = f.report(x)
print(
    f"{depth} {wall:.2f} {cpu:.2f} {run * 1e6:.2f} {len(r.plan.kernels)}",
    {k: round(v, 3) for k, v in getattr(r, "phases", {}).items()},
)
