"""The window ops' meaning on arrays of sympy expressions (`OpSpec.symbolic`, for verify).

Convolutions and average pools are sums of products: the array algorithms of ir/window_ops.py
run unchanged on object arrays of sympy expressions. Max pools compare: a window's value is
Max(taps) (padding -oo), and routing picks the first maximal tap (torch's tie rule) by a
Piecewise on strict comparisons with earlier taps and non-strict ones with later taps. `sv` is
verify's vocabulary (sv.sp is sympy), so this layer imports no sympy itself.

    SYMBOLIC["maxPool2d"](sv, [x], attrs, rtype)      # object arrays in and out
"""

from __future__ import annotations

import numpy as np

from .. import window_ops


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


def _first_max(sp, taps):
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


def _routed(sp, conds, values):
    return np.frompyfunc(lambda c, v: sp.Piecewise((v, c), (0, True)), 2, 1)(conds, values)


def _sympified(sv, x):
    # array algorithms leave plain 0s (np.zeros of objects) where no tap lands
    return sv.as_array(np.frompyfunc(sv.sp.sympify, 1, 1)(x))


def _generic(op: str):
    def meaning(sv, args, attrs, rtype):
        return _sympified(sv, window_ops.evaluate(op, np, [sv.as_array(a) for a in args], attrs))

    return meaning


def _max_pool(sv, args, attrs, rtype):
    taps = _taps(args[0], attrs, sv.sp.S.NegativeInfinity)
    out = np.empty(rtype.shape, dtype=object)
    for idx in np.ndindex(out.shape):
        out[idx] = sv.extremum(sv.sp.Max, list(taps[idx[:2] + (slice(None),) + idx[2:]]))
    return out


def _max_pool_backward(sv, args, attrs, rtype):
    x, dy = args
    conds = _first_max(sv.sp, _taps(x, attrs, sv.sp.S.NegativeInfinity))
    cols = _routed(sv.sp, conds, np.broadcast_to(np.expand_dims(dy, 2), conds.shape))
    return _sympified(sv, window_ops.spread_columns(np, cols, attrs, x.shape[2:]))


def _max_pool_gather(sv, args, attrs, rtype):
    x, g = args
    conds = _first_max(sv.sp, _taps(x, attrs, sv.sp.S.NegativeInfinity))
    return _sympified(sv, np.sum(_routed(sv.sp, conds, _taps(g, attrs, sv.sp.S.Zero)), axis=2))


SYMBOLIC = {op: _generic(op) for op in window_ops.CONV_OPS + ("avgPool2d", "avgPool2dBackward")}
SYMBOLIC.update(
    maxPool2d=_max_pool, maxPool2dBackward=_max_pool_backward, maxPool2dGather=_max_pool_gather
)
