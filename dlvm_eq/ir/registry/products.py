"""Products: `dot` (vectors and matrices, BLAS) and `batchMatmul` (one product per batch index).

    %y = dot %x: <4 x 3 x f32>, %w: <3 x 2 x f32>                     // <4 x 2 x f32>
    %z = batchMatmul %a: <8 x 4 x 3 x f32>, %b: <8 x 3 x 2 x f32>      // <8 x 4 x 2 x f32>

Under vmap a product with one operand batched stays one `dot` (the batch's rows, or columns, are
one product's); with both batched it becomes a `batchMatmul` (a multiply for outer products).
"""

from __future__ import annotations

import numpy as np

from ..op_spec import DOT, MATMUL_COST, OpSpec, fail, tensors
from ..types import BOOL, TensorType


def _dot_type(types, attrs):
    a, b = tensors("dot", types)
    if a.dtype != b.dtype:
        fail("dot", f"operands have different data types: {a}, {b}")
    if a.dtype is BOOL:
        fail("dot", "bool operands")
    if a.rank not in (1, 2) or b.rank not in (1, 2):
        fail("dot", f"expected vectors or matrices, got {a} and {b}")
    k_a = a.shape[-1]
    k_b = b.shape[0]
    if k_a != k_b:
        fail("dot", f"contracted dimensions differ: {a} · {b} ({k_a} vs {k_b})")
    return TensorType(a.shape[:-1] + b.shape[1:], a.dtype)


def _batch_matmul_type(types, attrs):
    a, b = tensors("batchMatmul", types)
    if a.dtype != b.dtype:
        fail("batchMatmul", f"operands have different data types: {a}, {b}")
    if a.dtype is BOOL:
        fail("batchMatmul", "bool operands")
    if a.rank < 3 or a.rank != b.rank:  # any rank: the adjoint rules swap the last two axes
        fail("batchMatmul", f"expected operands of one rank, 3 or more, got {a} and {b}")
    if a.shape[:-2] != b.shape[:-2]:
        fail("batchMatmul", f"batch dimensions differ: {a} and {b} (broadcast them first)")
    if a.shape[-1] != b.shape[-2]:
        fail(
            "batchMatmul",
            f"contracted dimensions differ: {a} · {b} ({a.shape[-1]} vs {b.shape[-2]})",
        )
    return TensorType(a.shape[:-1] + b.shape[-1:], a.dtype)


def _batch_dot(bt, op, args, batched, attrs):
    a, b = args
    B = bt.size
    if not batched[1]:  # rows of a batched left operand are rows of one product
        if a.type.rank == 2:  # (B, k) @ b
            return bt.emit("dot", [a, b])
        m, k = a.type.shape[1:]
        out = bt.emit("dot", [bt.emit("shapeCast", [a], shape=(B * m, k)), b])
        return bt.emit("shapeCast", [out], shape=(B, m) + b.type.shape[1:])
    if not batched[0]:  # columns of a batched right operand are columns of one product
        if b.type.rank == 2:  # a @ (B, k) vectors: (B, k) @ a^T
            return bt.emit("dot", [b, a if a.type.rank == 1 else bt.emit("transpose", [a])])
        k, n = b.type.shape[1:]
        cols = bt.emit("transpose", [b], perm=(1, 0, 2))
        cols = bt.emit("shapeCast", [cols], shape=(k, B * n))
        out = bt.emit("dot", [a, cols])  # (m, B * n) or (B * n,)
        if a.type.rank == 1:
            return bt.emit("shapeCast", [out], shape=(B, n))
        out = bt.emit("shapeCast", [out], shape=(a.type.shape[0], B, n))
        return bt.emit("transpose", [out], perm=(1, 0, 2))
    a_matrix, b_matrix = a.type.rank == 3, b.type.rank == 3
    k = b.type.shape[1]
    a3 = a if a_matrix else bt.emit("shapeCast", [a], shape=(B, 1, k))
    b3 = b if b_matrix else bt.emit("shapeCast", [b], shape=(B, k, 1))
    if k == 1:  # per-example outer products: a broadcasting multiply, not B products
        out = bt.emit("multiply", [a3, b3])
    else:
        out = bt.emit("batchMatmul", [a3, b3])
    shape = (B,) + a3.type.shape[1:2] * a_matrix + b3.type.shape[2:] * b_matrix
    return out if shape == out.type.shape else bt.emit("shapeCast", [out], shape=shape)


def _batch_batch_matmul(bt, op, args, batched, attrs):
    a, b = (x if bx else bt.full(x) for x, bx in zip(args, batched))
    return bt.emit("batchMatmul", [a, b])  # one more batch axis: batchMatmul takes any rank


def _dot_symbolic(sv, args, attrs, rtype):
    """Each entry one flat sympy Add of its products (not numpy's pairwise sums)."""
    a, b = args
    a2 = a.reshape((1,) + a.shape) if a.ndim == 1 else a
    b2 = b.reshape(b.shape + (1,)) if b.ndim == 1 else b
    full = np.empty((a2.shape[0], b2.shape[1]), dtype=object)
    for i in range(full.shape[0]):
        for j in range(full.shape[1]):
            full[i, j] = sv.sp.Add(*[a2[i, k] * b2[k, j] for k in range(a2.shape[1])])
    return full.reshape(rtype.shape)


def _batch_matmul_symbolic(sv, args, attrs, rtype):
    a, b = args
    out = np.empty(rtype.shape, dtype=object)
    for idx in np.ndindex(rtype.shape[:-2]):
        out[idx] = _dot_symbolic(sv, [a[idx], b[idx]], attrs, rtype.with_shape(rtype.shape[-2:]))
    return out


def dot_spec() -> OpSpec:
    return OpSpec(
        "dot",
        DOT,
        2,
        "Dot",
        _dot_type,
        lambda args, at: np.matmul(args[0], args[1]),
        cost=MATMUL_COST,
        batch=_batch_dot,
        symbolic=_dot_symbolic,
        infix=("@", 2),
    )


def batch_matmul_spec() -> OpSpec:
    # `batchMatmul %a: <B.. x m x k x T>, %b: <B.. x k x n x T>`: one product per batch index;
    # batch dimensions equal (the DSL broadcasts them explicitly, numpy's rules), any rank >= 3
    return OpSpec(
        "batchMatmul",
        DOT,
        2,
        "BatchMatmul",
        _batch_matmul_type,
        lambda args, at: np.matmul(args[0], args[1]),
        batch=_batch_batch_matmul,
        symbolic=_batch_matmul_symbolic,
    )
