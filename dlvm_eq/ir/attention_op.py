"""`attention`: softmax(q kᵀ · scale + bias) v in one op, the form rules/attention.egg derives
from the naive program (issue 33); codegen runs it without writing the score matrix.

    %o = attention %q: <B.. x m x d x T>, %k: <B.. x n x d x T>, %v: <B.. x n x e x T>,
                   %bias: B scale 0.125 [causal]

bias broadcasts (numpy's rules) to the scores' shape <B.. x m x n x T> (a scalar 0 where there
is none; padding masks are 0 / -inf); causal hides key j from query i where j > i (top-left
aligned, torch's `is_causal`). This is the interpreter's semantics, written the naive way: it is
the oracle the fused kernel is tested against.
"""

from __future__ import annotations

import numpy as np

from ..errors import IRError
from .types import TensorType, broadcast_shapes


class AttentionTypeError(IRError):
    """An ill-typed attention op. The message is formatted when read: verify-rules' shape
    search meets ~10^5 ill-typed candidates per rank-4 rule and reads none of the messages
    (formatting their TensorTypes was 3 of the 5 s its type checks took)."""

    def __str__(self) -> str:
        template, *values = self.args
        return "attention: " + template.format(*values)


def _fail(template: str, *values):
    raise AttentionTypeError(template, *values)


def attention_type(types, attrs) -> TensorType:
    if len(types) != 4 or not all(isinstance(t, TensorType) for t in types):
        _fail("expected four tensor operands: q, k, v, bias")
    q, k, v, bias = types
    if len({q.dtype, k.dtype, v.dtype, bias.dtype}) != 1 or not q.dtype.is_float:
        _fail("operands must share one floating-point type: {}, {}, {}, {}", q, k, v, bias)
    if not 2 <= q.rank <= 4 or not q.rank == k.rank == v.rank:
        _fail("q, k and v need equal ranks from 2 to 4: {}, {}, {}", q, k, v)
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        _fail("batch dimensions differ: {}, {}, {}", q, k, v)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        _fail("q·kᵀ or the product with v does not type-check: {}, {}, {}", q, k, v)
    scores = q.shape[:-1] + (k.shape[-2],)
    if broadcast_shapes(bias.shape, scores) != scores:
        _fail("bias {} does not broadcast to the scores' shape {}", bias, scores)
    if attrs.get("causal", 0) not in (0, 1):
        _fail("causal must be 0 or 1, not {}", attrs["causal"])
    return TensorType(q.shape[:-1] + (v.shape[-1],), q.dtype)


def causal_mask(m: int, n: int) -> np.ndarray:
    """True where query i may not see key j (j > i)."""
    return np.arange(n)[None, :] > np.arange(m)[:, None]


def attention(args, attrs):
    q, k, v, bias = args
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * q.dtype.type(attrs["scale"]) + bias
    if attrs.get("causal", 0):
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), -np.inf, s)
    with np.errstate(invalid="ignore"):  # a row with every key hidden is NaN, as the naive form
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return np.matmul(e / e.sum(axis=-1, keepdims=True), v).astype(q.dtype)


def attention_backward_type(types, attrs) -> TensorType:
    """attentionBackward q, k, v, bias, o, g: the adjoint of `attention` at operand wrt (0: q,
    1: k, 2: v), given its output o and the output's adjoint g."""
    if len(types) != 6:
        _fail("attentionBackward expects six operands: q, k, v, bias, o, g")
    out = attention_type(types[:4], attrs)
    if types[4] != out or types[5] != out:
        _fail("o and g must have the attention's type {}: {}, {}", out, types[4], types[5])
    if attrs.get("wrt") not in (0, 1, 2):
        _fail("wrt must be 0 (q), 1 (k) or 2 (v), not {}", attrs.get("wrt"))
    return types[attrs["wrt"]]


def attention_backward(args, attrs):
    """FlashAttention-2's backward written the naive way (the oracle of the fused kernel):
    P = softmax(x), dV = Pᵀ g, dS = P * (g vᵀ - rowsum(g * o)), dQ = dS k s, dK = dSᵀ q s."""
    q, k, v, bias, o, g = args
    sc = q.dtype.type(attrs["scale"])
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * sc + bias
    if attrs.get("causal", 0):
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), -np.inf, s)
    with np.errstate(invalid="ignore", divide="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        wrt = attrs["wrt"]
        if wrt == 2:
            return np.matmul(np.swapaxes(p, -1, -2), g).astype(q.dtype)
        rows = (g * o).sum(axis=-1, keepdims=True)
        ds = p * (np.matmul(g, np.swapaxes(v, -1, -2)) - rows)
        if wrt == 0:
            return (np.matmul(ds, k) * sc).astype(q.dtype)
        return (np.matmul(np.swapaxes(ds, -1, -2), q) * sc).astype(q.dtype)


# Key block x query block of scores that one thread keeps in its core's cache (the kernel's
# working set: a block of scores, its exp, and the running rows); codegen and the cost model
# both read these, so the price is that of the tiles the kernel really runs. The backward's:
QUERY_BLOCK = 128
KEY_BLOCK = 512
# The forward's own: a taller block of queries shares each packed key and value block among
# more rows, and its two products are the whole kernel (measured on the 2-core AVX-512 EPYC,
# one thread, CPU time, 4 heads of 64, load 6-8: 512 x 256 against 128 x 512 took 15.4
# against 16.9 ms at seq 1024 and 229 against 276 ms at seq 4096; BENCHMARKS.md, s17-attn).
FORWARD_QUERY_BLOCK = 512
FORWARD_KEY_BLOCK = 256
SHIPPED = (QUERY_BLOCK, KEY_BLOCK, FORWARD_QUERY_BLOCK, FORWARD_KEY_BLOCK)
# The tiles in use (backward's query and key, forward's query and key): the shipped ones, or a
# calibrated profile's (`attention_blocks` and `attention_forward_blocks`, timed by
# calibration/attention_tiles.py; pipeline/native.py sets them from this host's profile).
_TILES = list(SHIPPED)


def tile_blocks() -> tuple[int, int]:
    """(query block, key block) of the tiles the backward kernel runs now."""
    return _TILES[0], _TILES[1]


def forward_tile_blocks() -> tuple[int, int]:
    """(query block, key block) of the tiles the forward kernel runs now."""
    return _TILES[2], _TILES[3]


def use_tile_blocks(tiles: dict | None, forward: dict | None = None) -> None:
    """A profile's {"query": n, "key": n} for the backward and for the forward; None or {}:
    the shipped tiles of that kernel."""
    back = [tiles["query"], tiles["key"]] if tiles else list(SHIPPED[:2])
    _TILES[:] = back + ([forward["query"], forward["key"]] if forward else list(SHIPPED[2:]))


def blocks(m: int, n: int, causal: bool, tiles: tuple[int, int] | None = None) -> int:
    """(query block, key block) pairs the kernel visits for one batch index: with causal, only
    those on or below the diagonal. tiles: (query block, key block); None: tile_blocks()."""
    query_block, key_block = tiles or tile_blocks()
    total = 0
    for q0 in range(0, m, query_block):
        last = min(m, q0 + query_block) - 1  # the block's last query sees keys <= last
        keys = min(n, last + 1) if causal else n
        total += -(-keys // key_block)
    return total
