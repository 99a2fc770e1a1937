"""The fused attention's tiles for this host (issue 33): the forward and backward kernels
(codegen/runtime/attention_cpu.py, attention_backward.py) timed together over candidate
(query block, key block) tiles at a size where both are bound by their block products, for
the backward's tiles (`attention_blocks`), and the forward alone for its own
(`attention_forward_blocks`: a forward without a backward is a model's inference, and its two
products prefer taller query blocks). The fastest are kept in the profile, which codegen runs
(ir/attention_op.use_tile_blocks, from pipeline/native.py) and the cost model prices
(extract/attention_cost.machine_tiles). The shipped tiles are among the candidates, so a
profile only moves away from them where another measured faster. The forward's fixed cost
per (batch index, query block) task is measured too (`attention_task_seconds`: a fit over
sizes), which the cost model prices each fused task with.

    attention_blocks()           # {"query": 128, "key": 512}
    attention_forward_blocks()   # {"query": 512, "key": 256}
    attention_task_seconds()     # 3e-05 (seconds)
"""

from __future__ import annotations

import time

import numpy as np

from ..ir.attention_op import FORWARD_KEY_BLOCK, FORWARD_QUERY_BLOCK, KEY_BLOCK, QUERY_BLOCK
from .measure import fastest_seconds

CANDIDATES = ((QUERY_BLOCK, KEY_BLOCK), (64, 512), (128, 256), (64, 256), (256, 256))
SHAPE = (2, 1024, 64)  # batch x heads, seq, head dim: 2 x 8 x 2 pairs of the shipped tiles
FORWARD = (FORWARD_QUERY_BLOCK, FORWARD_KEY_BLOCK)
FORWARD_CANDIDATES = (FORWARD, (QUERY_BLOCK, KEY_BLOCK), (256, 256), (256, 512), (512, 512))
FORWARD_SHAPE = (2, 2048, 64)  # 2 x 4 x 8 pairs of the shipped forward tiles


def attention_blocks(candidates=CANDIDATES, shape=SHAPE) -> dict[str, int]:
    """The tile of `candidates` under which one forward and one backward take the least time
    (one thread each: the tile is a per-core choice; the fastest of a few repeats)."""
    from ..codegen.runtime.attention_backward import attention_backward
    from ..codegen.runtime.attention_cpu import attention_forward

    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
    o, lse = np.empty_like(q), np.empty(shape[:-1], np.float32)
    grads = [np.empty_like(q) for _ in range(3)]

    def step(tiles):
        attention_forward(q, k, v, 0.0, 0.125, False, o, 1, tiles, lse=lse)
        attention_backward(q, k, v, 0.0, 0.125, False, o, g, *grads, lse, 1, tiles)

    timed = [(fastest_seconds(lambda t=t: step(t), repeats=3, cap_s=1.0), t) for t in candidates]
    query, key = min(timed)[1]
    return {"query": query, "key": key}


def attention_forward_blocks(candidates=FORWARD_CANDIDATES, shape=FORWARD_SHAPE) -> dict[str, int]:
    """The tile of `candidates` under which one forward alone takes the least time (one thread;
    the fastest of a few repeats)."""
    from ..codegen.runtime.attention_cpu import attention_forward

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    o = np.empty_like(q)

    def step(tiles):
        attention_forward(q, k, v, 0.0, 0.125, False, o, 1, tiles)

    timed = [(fastest_seconds(lambda t=t: step(t), repeats=3, cap_s=1.0), t) for t in candidates]
    query, key = min(timed)[1]
    return {"query": query, "key": key}


# (tasks, key blocks a task) the forward's fixed costs are fit over: whole tiles only, so that
# every (query block, key block) pair does the same work, and at each count of pairs (4, 8, 16)
# the same pairs split over 1 to 16 tasks, so that a task's cost is the slope at a fixed
# count of pairs (a pair, ~0.44 ms here, is ~15x a task: with the pairs varied alongside, the
# fit put a task anywhere in 8-86 us)
TASK_FIT = tuple(
    (tasks, pairs // tasks) for pairs in (4, 8, 16) for tasks in (1, 2, 4, 8, 16) if tasks <= pairs
)


def attention_task_seconds(tiles=FORWARD, sizes=TASK_FIT, rounds: int = 3, timer=None) -> float:
    """The forward kernel's fixed seconds per (batch index, query block) task, one thread: the
    least-squares fit of t = call + task * tasks + pair * pairs over `sizes` (each a batch of
    `tasks` heads of one query block of `tiles`, against `keys` whole key blocks). Each size's
    time is the least CPU time over `rounds` sweeps of every size in turn (a slow stretch of a
    shared machine then falls on one sweep, not on one size). The cost model prices each fused
    task with it (extract/attention_cost.py); the call and the pair come out of the same fit
    but are priced otherwise (a pair by its block products at the BLAS rate). `timer(fn)`: the
    seconds one call of fn takes (default: the least CPU time of a few calls).

        attention_task_seconds()   # e.g. 3e-05 (the 2-core AVX-512 EPYC, 512 x 256 tiles)
    """
    from ..codegen.runtime.attention_cpu import attention_forward

    tq, tk = tiles
    rng = np.random.default_rng(0)
    runs = []
    for tasks, keys in sizes:
        q = rng.standard_normal((tasks, tq, 64), dtype=np.float32)
        k, v = (rng.standard_normal((tasks, keys * tk, 64), dtype=np.float32) for _ in range(2))
        o = np.empty_like(q)
        runs.append(
            lambda q=q, k=k, v=v, o=o: attention_forward(q, k, v, 0.0, 0.125, False, o, 1, tiles)
        )
    timer = timer or (lambda fn: _fastest_cpu_seconds(fn, repeats=5))
    best = [np.inf] * len(runs)
    for _ in range(rounds):
        for i, run in enumerate(runs):
            best[i] = min(best[i], timer(run))
    design = np.array([[1.0, tasks, tasks * keys] for tasks, keys in sizes])
    (_call, task, _pair), *_ = np.linalg.lstsq(design, np.array(best), rcond=None)
    return max(float(task), 0.0)


def _fastest_cpu_seconds(fn, repeats: int) -> float:
    """The least CPU time of this process over `repeats` calls of fn after a warm-up: the
    kernel runs on this thread alone (threads=1, OpenBLAS on one thread), so CPU time is its
    time without the other processes' share of the core (wall times of one tile moved
    0.56-0.78 ms between fits under a load of 5)."""
    fn()
    best = np.inf
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best
