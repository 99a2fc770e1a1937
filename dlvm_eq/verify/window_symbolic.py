"""Symbolic semantics of the convolution and pooling ops (ir/window_ops.py) for dlvm_eq.verify.

Convolutions and average pools are sums of products: the array algorithms of window_ops run
unchanged on object arrays of sympy expressions. Max pools compare: a window's value is
Max(taps) (padding -oo), and routing picks the first maximal tap (torch's tie rule) by a
Piecewise on strict comparisons with earlier taps and non-strict ones with later taps.

    table.update(window_table(as_array, extremum))
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from ..ir import window_ops


def _taps(x, attrs, pad):
    """(N, C, KH*KW, OH, OW) object array of x's window taps, padded with `pad`."""
    k, s, p = attrs["kernel"], attrs["stride"], attrs["padding"]
    n, c, h, w = x.shape
    full = np.full((n, c, h + p[0] + p[1], w + p[2] + p[3]), pad, dtype=object)
    full[:, :, p[0] : p[0] + h, p[2] : p[2] + w] = x
    oh = window_ops.out_size(h, k[0], s[0], p[0], p[1])
    ow = window_ops.out_size(w, k[1], s[1], p[2], p[3])
    out = np.empty((n, c, k[0] * k[1], oh, ow), dtype=object)
    for i in range(k[0]):
        for j in range(k[1]):
            out[:, :, i * k[1] + j] = full[
                :, :, i : i + s[0] * (oh - 1) + 1 : s[0], j : j + s[1] * (ow - 1) + 1 : s[1]
            ]
    return out


def _first_max(taps):
    """Per tap, the condition that it is its window's first maximum."""
    conds = np.empty(taps.shape, dtype=object)
    k = taps.shape[2]
    for idx in np.ndindex(taps.shape[:2] + taps.shape[3:]):
        col = [taps[idx[:2] + (t,) + idx[2:]] for t in range(k)]
        for t in range(k):
            terms = [col[t] > col[u] for u in range(t)] + [
                col[t] >= col[u] for u in range(t + 1, k)
            ]
            conds[idx[:2] + (t,) + idx[2:]] = sp.And(*terms)
    return conds


def _routed(conds, values):
    return np.frompyfunc(lambda c, v: sp.Piecewise((v, c), (0, True)), 2, 1)(conds, values)


_SYMPIFY = np.frompyfunc(sp.sympify, 1, 1)


def window_table(as_array, extremum) -> dict:
    # sympified: array algorithms leave plain 0s (np.zeros of objects) where no tap lands
    def generic(op):
        return lambda args, attrs, rtype: as_array(
            _SYMPIFY(window_ops.evaluate(op, np, [as_array(a) for a in args], attrs))
        )

    def max_pool(args, attrs, rtype):
        taps = _taps(args[0], attrs, sp.S.NegativeInfinity)
        out = np.empty(rtype.shape, dtype=object)
        for idx in np.ndindex(out.shape):
            out[idx] = extremum(sp.Max, list(taps[idx[:2] + (slice(None),) + idx[2:]]))
        return out

    def max_pool_backward(args, attrs, rtype):
        x, dy = args
        conds = _first_max(_taps(x, attrs, sp.S.NegativeInfinity))
        cols = _routed(conds, np.broadcast_to(np.expand_dims(dy, 2), conds.shape))
        return as_array(_SYMPIFY(window_ops.spread_columns(np, cols, attrs, x.shape[2:])))

    def max_pool_gather(args, attrs, rtype):
        x, g = args
        conds = _first_max(_taps(x, attrs, sp.S.NegativeInfinity))
        return as_array(_SYMPIFY(np.sum(_routed(conds, _taps(g, attrs, sp.S.Zero)), axis=2)))

    table = {op: generic(op) for op in window_ops.CONV_OPS + ("avgPool2d", "avgPool2dBackward")}
    table.update(
        maxPool2d=max_pool, maxPool2dBackward=max_pool_backward, maxPool2dGather=max_pool_gather
    )
    return table
