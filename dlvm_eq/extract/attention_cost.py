"""Cost of the fused `Attention` e-node (ir/attention_op.py): what the CPU or GPU kernel runs.

Per batch index, each (query block, key block) pair costs its two block products at the
calibrated matmul rate, the softmax work on the block's scores (an exp and a few flops per
score, in cache: no memory traffic), and a fixed per-block overhead of the kernel's calls; q,
the output, and k and v (again per query block where one batch index's do not fit in a
core's cache) move through memory, overlapped with the arithmetic (the larger of the two). The plain program
instead writes and reads the seq x seq scores several times; extraction compares the two.
On the gpu machine, the PTX kernels (codegen/gpu/attention_ptx.py, attention_backward_ptx.py)
are priced per launch from the machine's flop rate and bandwidth (`gpu_attention_seconds`).

    attention_seconds(cost, result_type, child)    # child(i): operand i's TensorType or None
"""

from __future__ import annotations

import math

from ..ir.attention_op import FORWARD_KEY_BLOCK, FORWARD_QUERY_BLOCK, KEY_BLOCK, QUERY_BLOCK, blocks
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
# Each (batch index, query block) task adds its Python dispatch (the operands' addresses, a
# ctypes call of 22 arguments), its scratch, q's scaled copy, o's zeroing and the final
# division. `dlvm-eq calibrate` measures it on the host: the slope of a fit over sizes at a
# fixed count of tile pairs (calibration/attention_tiles.attention_task_seconds, kept in the
# profile), which a calibrated machine prices with (`task_seconds`). Measured so on the 2-core
# AVX-512 EPYC (s18, 512 x 256 tiles, one thread, CPU time, 15 fits): 24-26 us in the four at
# load 5.3-5.7, 22-45 us (median 34) as the load rose to 7.6, by
#   OPENBLAS_NUM_THREADS=1 DLVM_EQ_NUM_THREADS=1 python -c "from dlvm_eq.calibration.\
#   attention_tiles import attention_task_seconds as t; print(t())"
# The shipped defaults keep 20 us, below the measured 25-34. Under the flat 300 GFLOP/s they
# had before, 22 us already extracted the plain backward of a (2, 1024, 64) value_and_grad
# (tests/test_attention_backward_native.py). The still-optional machine.measured_cpu prices a
# product at 100 GFLOP/s a BLAS thread, with the plain program's seq x seq arrays streamed at
# machine.BLAS_STREAM. Under it 30 us ranks the recorded pairs (tests/test_attention_pricing.py)
# as 20 does.
CALL_SECONDS = 40e-6
BLOCK_SECONDS = 3e-6
TASK_SECONDS = 20e-6


def task_seconds(mc) -> float:
    """A fused forward task's fixed seconds on machine `mc`: its profile's measurement where it
    has one (`attention_task_seconds`), else TASK_SECONDS."""
    if mc.profile:
        profile = load_profile(mc.name)
        if profile is not None and profile.attention_task_seconds:
            return profile.attention_task_seconds
    return TASK_SECONDS


def machine_tiles(mc, forward: bool = False) -> tuple[int, int]:
    """(query block, key block) the backward kernel (forward: the forward kernel) runs on this
    machine: its profile's `attention_blocks` (`attention_forward_blocks`;
    calibration/attention_tiles.py) where it has them, else the shipped tiles (codegen reads
    the same: pipeline/native.py sets them from the profile)."""
    if mc.profile:
        profile = load_profile(mc.name)
        tiles = None if profile is None else profile.attention_blocks
        if forward and profile is not None:
            tiles = profile.attention_forward_blocks
        if tiles:
            return tiles["query"], tiles["key"]
    return (FORWARD_QUERY_BLOCK, FORWARD_KEY_BLOCK) if forward else (QUERY_BLOCK, KEY_BLOCK)


def attention_seconds(cost, t, child, causal: bool = False) -> float:
    q, k, v = child(0), child(1), child(2)
    if q is None or k is None or v is None or t is None:
        return INF
    if cost.machine.name == "gpu":
        return gpu_attention_seconds(cost.machine, q, k, v, t, causal)
    mc = cost.machine
    m, d, n, e = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    batch = math.prod(q.shape[:-2])
    tq, tk = machine_tiles(mc, forward=True)
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
        + batch * -(-m // tq) * task_seconds(mc)
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
        return gpu_attention_backward_seconds(cost.machine, q, k, v, t, causal) / 3
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


# The GPU kernels (codegen/gpu/attention_ptx.py, attention_backward_ptx.py): a thread per query
# row (the backward's "dkv": per key row), GPU_QUERY_BLOCK rows a CTA, k and v (for "dkv": q,
# dO, lse and D) tiles through shared memory, scalar FMAs (no tensor cores): their flops run at
# the machine's elementwise flop_rate, and only as many lanes work as the launch has rows
# (each row's keys run in sequence on its thread). Not measured on a device: none was lent.
GPU_QUERY_BLOCK = 64  # codegen/gpu/attention_ptx.QUERY_BLOCK (tests/test_attention_gpu_pricing.py)
GPU_KEY_BLOCK = 32  # codegen/gpu/attention_ptx.KEY_BLOCK
# FP32 lanes of the device the shipped gpu machine describes (an H100: 132 SMs x 128 lanes):
# a launch of fewer rows runs at rows / GPU_LANES of flop_rate
GPU_LANES = 132 * 128
# a score's flops beyond its dot products: the polymath exp and the running max and rescale
GPU_SCORE_FLOPS = 12


def _gpu_scores(m: int, n: int, causal: bool) -> int:
    """Scores one batch index's kernel visits: all, or under causal the tiles on or below the
    diagonal (a CTA stops after its last query's key tile; hidden scores in them still cost)."""
    if not causal:
        return m * n
    tiles = blocks(m, n, True, (GPU_QUERY_BLOCK, GPU_KEY_BLOCK))
    return min(m * n, tiles * min(m, GPU_QUERY_BLOCK) * min(n, GPU_KEY_BLOCK))


def _gpu_launch(mc, flops: float, rows: int, moved: float) -> float:
    """One launch: its flops over the lanes its rows fill, or its bytes, whichever is longer."""
    rate = mc.flop_rate * min(1.0, rows / GPU_LANES)
    return mc.launch + max(flops / rate, moved / mc.bandwidth)


def _gpu_applies(q, v) -> bool:
    """Whether the PTX kernel runs (codegen/gpu/attention_gpu.attention_spec): at most two
    batch dims, no empty dim; else the step runs the reference, which writes the scores."""
    return q.rank <= 4 and 0 not in (*q.shape, *v.shape)


def gpu_attention_seconds(mc, q, k, v, t, causal: bool = False) -> float:
    """The forward kernel: 2(d + e) flops a score plus the exp and rescale; q and o (and the
    row log-sum-exp) once, k and v once per query block (every CTA reads them all).

    >>> from dlvm_eq.extract.machine import MACHINES
    >>> from dlvm_eq.ir.types import DType, TensorType
    >>> x = TensorType((8, 4096, 64), DType.f32)
    >>> 1e-4 < gpu_attention_seconds(MACHINES["gpu"], x, x, x, x) < 1e-3
    True
    """
    if not _gpu_applies(q, v):
        return INF
    m, d, n, e = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    batch = math.prod(q.shape[:-2])
    scores = batch * _gpu_scores(m, n, causal)
    size = t.dtype.itemsize
    moved = (q.size + t.size + batch * m) * size
    moved += (k.size + v.size) * size * -(-m // GPU_QUERY_BLOCK)
    flops = scores * (2 * (d + e) + GPU_SCORE_FLOPS)
    return mc.node_overhead + _gpu_launch(mc, flops, batch * m, moved)


def gpu_attention_backward_seconds(mc, q, k, v, t, causal: bool = False) -> float:
    """dQ, dK and dV together: the "dq" launch (a thread per query row: the score, dP = dO.v
    and dQ's update, 2(2d + e) flops a score; k and v per query block) and the "dkv" launch
    (a thread per key row: the score, dP, dV's and dK's updates, 2(2d + 2e) flops a score; q,
    dO, lse and D per key block): about 3.5 forwards."""
    if not _gpu_applies(q, v):
        return INF
    m, d, n, e = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    batch = math.prod(q.shape[:-2])
    scores = batch * _gpu_scores(m, n, causal)
    size = t.dtype.itemsize
    rows_q = batch * m * (2 * d + 2 * e + 2)  # q, dq; dO, o; lse, D
    rows_k = batch * n * (2 * d + 2 * e)  # k, dk; v, dv
    dq_moved = (rows_q + batch * n * (d + e) * -(-m // GPU_QUERY_BLOCK)) * size
    dkv_moved = (rows_k + batch * m * (d + e + 2) * -(-n // GPU_QUERY_BLOCK)) * size
    dq = _gpu_launch(mc, scores * (2 * (2 * d + e) + GPU_SCORE_FLOPS), batch * m, dq_moved)
    dkv = _gpu_launch(mc, scores * (2 * (2 * d + 2 * e) + GPU_SCORE_FLOPS), batch * n, dkv_moved)
    return mc.node_overhead + dq + dkv
