"""Cost of convolution and pooling e-nodes (ir/window_ops.py): what codegen runs for them.

A convolution (or either of its adjoints) is an im2col copy of its window matrix (every group's
rows: C·KH·KW by N·OH·OW) plus one product per group (runtime/conv_cpu.py runs them so, and
calibration/plan_cost.window_work prices them so): a depthwise convolution is C products of one
row each, a call apiece, not one GEMM of its flops), and the transposing copy between NCHW and
the products' layout; a pool is a kernel that reads every window tap.
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
        w = t if op == "Conv2dBackwardWeight" else b  # (O, C/g, KH, KW)
        x = t if op == "Conv2dBackwardInput" else a  # (N, C, H, W)
        y = {"Conv2d": t, "Conv2dBackwardInput": a}.get(op, b)  # (N, O, OH, OW)
        groups = max(1, x.shape[1] // w.shape[1])
        o, rows, positions = w.shape[0] // groups, math.prod(w.shape[1:]), y.size // y.shape[1]
        m, k, n = {  # one group's product
            "Conv2d": (o, rows, positions),
            "Conv2dBackwardInput": (rows, o, positions),  # then col2im
        }.get(op, (o, positions, rows))
        cols = groups * rows * positions
        products = groups * cost.dot_seconds(m, k, n)
        # plus the layout copy between NCHW and the products' (O, N*OH*OW): of the result
        # (forward) or of dY (adjoints); conv_cpu skips it where it runs one product per image
        layout = cost.kernel_seconds(0, y, copies=2) - cost.machine.launch
        return products + cost.kernel_seconds(0, t.with_shape((cols,)), copies=2) + layout
    (x,) = kids
    return cost.kernel_seconds(max(x.size, t.size) * 4, t, copies=2)
