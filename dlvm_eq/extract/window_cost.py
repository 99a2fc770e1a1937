"""Cost of convolution and pooling e-nodes (ir/window_ops.py): what codegen runs for them.

A convolution (or either of its adjoints) is an im2col copy of its window matrix plus one GEMM
of 2·(output elements)·(taps per output) flops; a pool is a kernel that reads every window tap.
"""

from __future__ import annotations

import math

INF = math.inf


def window_seconds(cost, op: str, t, child) -> float:
    """Seconds of window e-node `op` with result type t (cost: a TargetCost; child(i): operand types)."""
    kids = [child(i) for i in range(2 if op.startswith("Conv2d") else 1)]
    if any(k is None for k in kids):
        return INF
    if op.startswith("Conv2d"):
        a, b = kids
        if op == "Conv2d":  # x (N C H W), w (O Cg KH KW): O x (Cg KH KW) x (N OH OW)
            m, k, n = b.shape[0], math.prod(b.shape[1:]), t.size // b.shape[0]
        elif op == "Conv2dBackwardInput":  # dy, w: (Cg KH KW) x Og x (N OH OW), then col2im
            m, k, n = math.prod(b.shape[1:]), b.shape[0], a.size // a.shape[1]
        else:  # x, dy -> w: O x (N OH OW) x (Cg KH KW)
            m, k, n = b.shape[1], b.size // b.shape[1], t.size // t.shape[0]
        cols = k * n if op == "Conv2d" else m * n
        return cost.dot_seconds(m, k, n) + cost.kernel_seconds(0, t.with_shape((cols,)), copies=2)
    (x,) = kids
    return cost.kernel_seconds(max(x.size, t.size) * 4, t, copies=2)
