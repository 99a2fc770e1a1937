"""Products written straight into the layout their reader wants (CPU plans, issues 33/36).

A batched product whose only reader is a copy kernel that permutes its axes (attention's head
merge: `transpose(attn @ v, (0, 2, 1, 3))` before the reshape to (B*T, H*d), and the same for
the adjoints dQ, dK, dV in the backward pass) writes its entries through strides into the
copy's output instead (plan.BlasStep.out_view): the copy and the product's own buffer are gone.
Each entry is a matrix of the result with a unit stride along its rows or its columns, which
our GEMM writes with a leading dimension (runtime/batch_gemm.py; a column-major entry is
computed as outᵀ = bᵀ aᵀ).

    nodes = write_in_reader_layout(nodes, slots)    # planner.finish, after fuse_epilogues

Why here and not in the e-graph: the IR's product has one result layout (C order), so "the
product in layout P" is not a term the rules can name; the choice has no cost trade-off either
(the strided write costs the GEMM nothing measurable, the copy is a full pass over the result:
the transformer step's `k1_copy` and `k33_copy`, 0.9 ms of 131 on one thread), so every copy
that qualifies is removed and the plan's predicted time drops by the copy's price.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..kernels.kernel_spec import KernelSpec, c_strides
from ..kernels.spec import Load
from .plan import TEMP, BlasStep, KernelStep, View
from .steps_order import Node, producers_and_readers

ENABLED = True  # benchmarks/head_layout.py measures with it off; part of the plan cache's key


def write_in_reader_layout(nodes: list[Node], slots) -> list[Node]:
    """`nodes` with every (batched product, permuting copy) pair made one product node."""
    if not ENABLED:
        return nodes
    producer, readers = producers_and_readers(nodes)
    replaced: dict[int, Node] = {}  # id(product node) -> its new node
    dropped: set[int] = set()  # ids of copy nodes now done by their products
    for node in nodes:
        moves = _copy_moves(node, slots, producer, readers, replaced)
        if moves is None:
            continue
        for blas_node, out_view in moves:
            blas = blas_node.payload
            new = dataclasses.replace(blas, out=out_view.slot, out_view=out_view)
            replaced[id(blas_node)] = Node(
                set(blas_node.inputs), [out_view.slot], blas_node.order, new
            )
        dropped.add(id(node))
    return [replaced.get(id(n), n) for n in nodes if id(n) not in dropped]


def _copy_moves(node, slots, producer, readers, replaced) -> list | None:
    """[(product node, the product's out_view)] when every output of `node` is a permuted copy
    of a batched product's result that nothing else reads; else None."""
    k = node.payload
    if not isinstance(k, KernelStep) or not isinstance(k.spec, KernelSpec):
        return None
    spec = k.spec
    moves = []
    for q, expr in enumerate(spec.outputs):
        if not isinstance(expr, Load) or expr.index >= len(k.inputs):
            return None
        src = k.inputs[expr.index]
        blas_node = producer.get(src)
        if (
            blas_node is None
            or id(blas_node) in replaced
            or not isinstance(blas_node.payload, BlasStep)
            or blas_node.payload.out_view is not None
            or slots[src].role != TEMP
            or readers.get(src) != 1
            or k.inputs.count(src) != 1
            or any(b is blas_node for b, _ in moves)
        ):
            return None
        out = k.outputs[q]
        if slots[out].dtype != slots[src].dtype or slots[src].dtype != "f32":
            return None
        strides = spec.inputs[expr.index].strides or c_strides(spec.shape)
        view = _out_view(slots[src].shape, spec.shape, strides, out)
        if view is None:
            return None
        moves.append((blas_node, view))
    return moves or None


def _out_view(shape: tuple, it_shape: tuple, it_strides: tuple, out: int) -> View | None:
    """The view of the copy's output slot `out` (C order over `it_shape`) through which a
    product of result `shape` writes each element where the copy would have put it: the copy
    reads the result at `it_strides` (elements, over `it_shape`), a permutation of its C
    strides. None when it is not a permutation or an entry would have no unit stride."""
    if len(shape) < 3 or math.prod(shape) != math.prod(it_shape) or math.prod(shape) == 0:
        return None
    src_c, dst_c = c_strides(shape), c_strides(it_shape)
    view = [0] * len(shape)
    taken = [False] * len(shape)
    for size, s_in, s_out in zip(it_shape, it_strides, dst_c):
        if size == 1:
            continue
        match = [
            a for a in range(len(shape)) if not taken[a] and shape[a] == size and src_c[a] == s_in
        ]
        if not match:
            return None
        taken[match[0]] = True
        view[match[0]] = s_out
    if any(not t and d != 1 for t, d in zip(taken, shape)):
        return None
    if 1 not in (view[-1], view[-2]):
        return None
    return View(out, tuple(shape), tuple(view))


def strided_view_fn(view: View):
    """A function of slot `view.slot`'s array giving the product's result view into it (the
    view of the last array it was given is kept: an arena's arrays are the same every call)."""
    last: list = [None]  # one (array, view) pair, replaced whole: threads never mix two

    def fn(x):
        pair = last[0]
        if pair is None or pair[0] is not x:
            strides = tuple(x.itemsize * s for s in view.strides)
            pair = last[0] = (x, np.lib.stride_tricks.as_strided(x, view.shape, strides))
        return pair[1]

    return fn


__all__ = ["strided_view_fn", "write_in_reader_layout"]
