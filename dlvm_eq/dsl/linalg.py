"""`matmul` (`a @ b`) with numpy's rules for any ranks >= 1, lowered onto two IR ops:

    a (m, k) @ b (k, n)          -> dot                         (vectors and matrices)
    a (2, 3, 4) @ b (4, 5)       -> shapeCast a to 6 x 4; dot; shapeCast to 2 x 3 x 5
    a (2, 3, 4) @ b (2, 4, 5)    -> batchMatmul                 (one BLAS call for the batch)
    a (4,) @ b (2, 4, 5)         -> a as 1 x 4, broadcast to 2 x 1 x 4; batchMatmul; drop the 1

Batch dimensions broadcast as numpy's do, through explicit `broadcast` ops: codegen reads them
as stride-0 views (no copy), and their adjoints sum the gradient back over the broadcast axes.
"""

from __future__ import annotations

import math

from ..ir.types import broadcast_shapes
from .context import shape_error
from .ops import reshape, shape_of
from .primitive import bind


def matmul(a, b):
    """`a @ b` with numpy's rules: vectors, matrices and stacks of matrices whose batch
    dimensions broadcast, e.g. (2, 3, 4) @ (4, 5) -> (2, 3, 5)."""
    sa, sb = tuple(shape_of(a)), tuple(shape_of(b))
    if not sa or not sb:
        raise shape_error(
            f"matmul of shapes {sa} and {sb}: operands must have at least one "
            "dimension (use * for scalars)"
        )
    k_a, k_b = sa[-1], (sb[0] if len(sb) == 1 else sb[-2])
    if k_a != k_b:
        raise shape_error(
            f"matmul of shapes {sa} and {sb}: contracted dimensions differ ({k_a} vs {k_b})"
        )
    if len(sa) <= 2 and len(sb) <= 2:
        return bind("dot", [a, b], name="matmul")
    if len(sb) <= 2:  # b has no batch: one GEMM over a's rows, all batches at once
        rows = reshape(a, (math.prod(sa[:-1]), k_a))
        return reshape(bind("dot", [rows, b], name="matmul"), sa[:-1] + sb[1:])
    return _batched(a, b, sa, sb)


def _batched(a, b, sa, sb):
    vector_a = len(sa) == 1
    ma = (1,) + sa if vector_a else sa  # numpy: a vector is a row, dropped after
    batch = broadcast_shapes(ma[:-2], sb[:-2])
    if batch is None:
        raise shape_error(
            f"matmul of shapes {sa} and {sb}: batch dimensions {ma[:-2]} and "
            f"{sb[:-2]} do not broadcast"
        )
    full_a, full_b = batch + ma[-2:], batch + sb[-2:]
    a, b = _to(a, sa, full_a), _to(b, sb, full_b)
    out = bind("batchMatmul", [a, b], name="matmul")
    want = batch + ((sb[-1],) if vector_a else (ma[-2], sb[-1]))
    return out if tuple(shape_of(out)) == want else reshape(out, want)


def _to(x, shape, full):
    """x of `shape` as `full`: leading 1s by a (free) shape cast, then a broadcast if needed."""
    padded = (1,) * (len(full) - len(shape)) + tuple(shape)
    if padded != tuple(shape):
        x = reshape(x, padded)
    if padded != tuple(full):
        x = bind("broadcast", [x], name="matmul", shape=tuple(full))
    return x
