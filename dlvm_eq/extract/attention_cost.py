"""Cost of the fused `Attention` e-node (ir/attention_op.py): what the CPU kernel runs.

Per batch index, each (query block, key block) pair costs its two block products at the
calibrated matmul rate, the softmax work on the block's scores (an exp and a few flops per
score, in cache: no memory traffic), and a fixed per-block overhead of the kernel's calls; q,
the output, and k and v (again per query block where one batch index's do not fit in a
core's cache) move through memory, overlapped with the arithmetic (the larger of the two). The plain program
instead writes and reads the seq x seq scores several times; extraction compares the two.

    attention_seconds(cost, result_type, child)    # child(i): operand i's TensorType or None
"""

from __future__ import annotations

import math

from ..ir.attention_op import KEY_BLOCK, QUERY_BLOCK, blocks
from .profile import load_profile

INF = math.inf
CACHE_BYTES = 512 * 1024  # a core's L2 (target_cost.CACHE_BYTES)
# The kernels' passes over a block of scores, priced against their own block products (the
# machine's BLAS rate: measured on a calibrated machine) rather than at the elementwise flop
# rate of a map kernel: they run in cache, vectorized, with attention_ir.exp2_nonpositive (half
# polymath's exp), between sgemm calls on the same core. Measured on the 2-core EPYC (one
# thread, CPU time, seq 1024, 4 heads, head dim 64, tiles 128 x 512, load 4-5): the forward's
# two products alone 14.5 ms, the whole kernel 15.9, so a score's max and exp/sum passes cost
# what 24 flops of the products cost; the backward's exp and dS passes ~55 of a pair's ~555 us
# (session 15): 70 flops a score. (Priced before as an exp and 6 flops at the map flop rate,
# the forward's passes came out 3.7x dearer than measured, beside products at the BLAS rate:
# 1.3 of a predicted 4.9 ms at seq 1024, where they take a twelfth of the kernel.)
FWD_SCORE_BLAS_FLOPS = 24
BWD_SCORE_BLAS_FLOPS = 70
# The native kernel's fixed costs (codegen/cpu/attention_ir.py through runtime/attention_cpu.py),
# measured on the 2-core EPYC under load 10 (CPU time, so the other jobs' share is not in it):
# a call with one tiny block took 40 us (ctypes, task dispatch, OpenBLAS's thread setting), and
# each (query block, key block) pair adds two direct cblas_sgemm calls and a pass's set-up per
# row, ~3 us beyond its arithmetic. (The numpy-driven kernel before it: 55 us and 20 us.)
CALL_SECONDS = 40e-6
BLOCK_SECONDS = 3e-6


def machine_tiles(mc) -> tuple[int, int]:
    """(query block, key block) the kernels run on this machine: its profile's
    `attention_blocks` (calibration/attention_tiles.py) where it has them, else the shipped
    tiles (codegen reads the same: pipeline/native.py sets them from the profile)."""
    if mc.profile:
        profile = load_profile(mc.name)
        if profile is not None and profile.attention_blocks:
            return profile.attention_blocks["query"], profile.attention_blocks["key"]
    return QUERY_BLOCK, KEY_BLOCK


def attention_seconds(cost, t, child, causal: bool = False) -> float:
    q, k, v = child(0), child(1), child(2)
    if q is None or k is None or v is None or t is None:
        return INF
    if cost.machine.name == "gpu":  # no fused kernel there yet: the step writes the scores
        return INF
    mc = cost.machine
    m, d, n, e = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    batch = math.prod(q.shape[:-2])
    tq, tk = machine_tiles(mc)
    pairs = batch * blocks(m, n, causal, (tq, tk))
    bq, bk = min(m, tq), min(n, tk)
    products = cost.dot_seconds(bq, d, bk) + cost.dot_seconds(bq, bk, e)
    if not mc.matmul_grid:  # the defaults price a product as a plan step's launch plus flops;
        products -= 2 * mc.launch  # these are direct calls inside one step (BLOCK_SECONDS)
    scores = bq * bk * FWD_SCORE_BLAS_FLOPS / mc.blas_rate
    itemsize = t.dtype.itemsize
    # one batch index's k and v are read again by each query block, from the core's cache
    # when they fit there, else from memory
    kv = (k.size + v.size) * itemsize
    rereads = 1 if kv // max(batch, 1) <= CACHE_BYTES else -(-m // tq)
    moved = (q.size + t.size) * itemsize + kv * rereads
    # k and v stream under the block products (64 flops a byte re-read at head dim 64): the
    # memory time overlaps the arithmetic. Measured: the blocked products of seq 1024 took the
    # CPU time of the whole-size ones (16.6 against 17.1 ms, OpenBLAS, one thread, load 10).
    return (
        mc.node_overhead
        + CALL_SECONDS
        + max(pairs * (products + scores + BLOCK_SECONDS), moved / mc.bandwidth)
    )


# The fused backward (codegen/cpu/attention_backward_ir.py through
# runtime/attention_backward.py): per (key block, query block) pair, five block products
# through cblas_sgemm and two vectorized passes over the tile's scores (P's exp; dS), in cache.
# Measured on the 2-core EPYC (one thread, OpenBLAS on one thread, load 2.8, best of 5): a pair
# at head dim 64 took 550-565 us, 500 of them its five products (84 GFLOP/s), so the passes
# cost a ninth of the products (BWD_SCORE_BLAS_FLOPS). A call on one tiny block took 105 us (D, the
# scaled q, the dQ shares' sum, OpenBLAS's thread setting, the tasks): BWD_CALL_SECONDS; the
# pair's five sgemm calls and row loops beyond their arithmetic: BWD_BLOCK_SECONDS. (The
# numpy-driven backward before it: 660 us a pair, 135 of them the passes, 97 us a call.)
BWD_CALL_SECONDS = 100e-6
BWD_BLOCK_SECONDS = 4e-6


def attention_backward_seconds(cost, t, child, causal: bool = False) -> float:
    """One of the three AttentionBackward e-nodes of an attention: a third of the kernel that
    computes dQ, dK and dV together (codegen runs the three as one step)."""
    q, k, v = child(0), child(1), child(2)
    if q is None or k is None or v is None or t is None:
        return INF
    if cost.machine.name == "gpu":
        return INF
    mc = cost.machine
    m, d, n, e = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    batch = math.prod(q.shape[:-2])
    tq, tk = machine_tiles(mc)
    pairs = batch * blocks(m, n, causal, (tq, tk))
    bq, bk = min(m, tq), min(n, tk)
    products = 3 * cost.dot_seconds(bq, d, bk) + 2 * cost.dot_seconds(bq, bk, e)
    if not mc.matmul_grid:
        products -= 5 * mc.launch
    scores = bq * bk * BWD_SCORE_BLAS_FLOPS / mc.blas_rate
    itemsize = t.dtype.itemsize
    shares = -(-n // tk) * batch * m * d * itemsize  # dQ's shares, written and added
    moved = (2 * q.size + 2 * k.size + 2 * v.size + 2 * batch * m * e) * itemsize + 2 * shares
    total = (
        mc.node_overhead
        + BWD_CALL_SECONDS
        + max(pairs * (products + scores + BWD_BLOCK_SECONDS), moved / mc.bandwidth)
    )
    return total / 3
