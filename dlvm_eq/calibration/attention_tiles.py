"""The fused attention's tiles for this host (issue 33): the forward and backward kernels
(codegen/runtime/attention_cpu.py, attention_backward.py) timed together over candidate
(query block, key block) tiles at a size where both are bound by their block products, for
the backward's tiles (`attention_blocks`), and the forward alone for its own
(`attention_forward_blocks`: a forward without a backward is a model's inference, and its two
products prefer taller query blocks). The fastest are kept in the profile, which codegen runs
(ir/attention_op.use_tile_blocks, from pipeline/native.py) and the cost model prices
(extract/attention_cost.machine_tiles). The shipped tiles are among the candidates, so a
profile only moves away from them where another measured faster.

    attention_blocks()           # {"query": 128, "key": 512}
    attention_forward_blocks()   # {"query": 512, "key": 256}
"""

from __future__ import annotations

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
