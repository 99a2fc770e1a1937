"""Cost of the fused `Attention` e-node (ir/attention_op.py): what the CPU kernel runs.

Per batch index, each (query block, key block) pair costs its two block products at the
calibrated matmul rate, the softmax work on the block's scores (an exp and a few flops per
score, in cache: no memory traffic), and a fixed per-block overhead of the kernel's calls; q,
the output and one pass of k and v per query block move through memory. The plain program
instead writes and reads the seq x seq scores several times; extraction compares the two.

    attention_seconds(cost, result_type, child)    # child(i): operand i's TensorType or None
"""

from __future__ import annotations

import math

from ..ir.attention_op import KEY_BLOCK, QUERY_BLOCK, blocks

INF = math.inf
SOFTMAX_FLOPS = 6  # per score besides its exp: scale, bias, max, subtract, sum, rescale
CALLS_PER_BLOCK = 10  # array calls per block in the kernel (products, exp, max, sums, rescale)


def attention_seconds(cost, t, child, causal: bool = False) -> float:
    from .target_cost import flops_per_element  # late: target_cost imports this module

    q, k, v = child(0), child(1), child(2)
    if q is None or k is None or v is None or t is None:
        return INF
    mc = cost.machine
    m, d, n, e = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    batch = math.prod(q.shape[:-2])
    pairs = batch * blocks(m, n, causal)
    bq, bk = min(m, QUERY_BLOCK), min(n, KEY_BLOCK)
    products = cost.dot_seconds(bq, d, bk) + cost.dot_seconds(bq, bk, e)
    scores = bq * bk * (flops_per_element("Exp", mc) + SOFTMAX_FLOPS) / mc.flop_rate
    itemsize = t.dtype.itemsize
    moved = (q.size + t.size + (k.size + v.size) * -(-m // QUERY_BLOCK)) * itemsize
    return (
        mc.node_overhead
        + mc.launch
        + pairs * (products + scores + CALLS_PER_BLOCK * mc.step_call)
        + moved / mc.bandwidth
    )
