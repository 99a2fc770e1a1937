"""Whether a concatenation e-node will be written in place by the CPU planner
(codegen/planning/concat_in_place.py), so that target_cost.py can price it free and not as a
copy (where PRICED_FREE is set: off by default, below).

The planner writes a concatenation in place when each part is a temporary written by a product
(through its leading dimension, any axis) or, where the part is one contiguous block of the
result (only 1s before the axis), by a map kernel. Here a part counts when its e-class holds
such a producer, seen through the layout ops the planner turns into the product's own strided
write (a shape cast, the head merge's transpose) and through concatenations along the same
axis (the planner copies their parts itself). Extraction picks one node per class and cannot
see a part's other readers, so this is the planner's condition as far as one e-node shows it;
a part also read elsewhere makes the planner copy after all.

    in_place_parts(graph, node_index, (2048, 768), 1)    # x^T [dQ|dK|dV]: True
"""

from __future__ import annotations

import math

from ..ir.op_spec import MATMUL_COST
from ..ir.ops import ELEMENTWISE_KINDS, OPS

# Extraction prices an in-place concatenation free only when this is set. Off: it cannot see
# a part's other readers, and priced free it chose concatenated forms the planner then copied:
# the tied-embedding attention LM measured 0.93x and causal attention 0.93x algebra-off
# (benchmarks/egraph_value.py, one thread, quiet, session 18), 1.16x and 1.04x priced as the
# copy. The planner still writes in place wherever it can (codegen/planning/concat_in_place.py).
PRICED_FREE = False

PRODUCTS = frozenset(s.egg for s in OPS.values() if s.cost == MATMUL_COST) | {"Gemm", "BatchMatmul"}
MAPS = frozenset(s.egg for s in OPS.values() if s.kind in ELEMENTWISE_KINDS)
# layout ops a product writes through its strides (planning/product_layout.py, a reshape view)
THROUGH = frozenset(("ShapeCast", "Transpose"))
DEPTH = 4  # layout ops followed below a part (the head merge is a transpose and a shape cast)


def in_place_parts(graph, node: int, shape: tuple, axis: int) -> bool:
    """Whether every part of concatenation node `node` (of result `shape`, along `axis`) can be
    written by its producer straight into the result."""
    block = math.prod(shape[:axis]) == 1  # each part one contiguous block: kernels write it too
    stack, seen = [(graph.children[node][0], 0), (graph.children[node][1], 0)], 0
    while stack:
        cls, nesting = stack.pop()
        seen += 1
        if seen > 64:  # a concatenation of very many parts: priced as the copy
            return False
        inner = [
            m
            for m in graph.class_nodes[cls]
            if graph.ops[m] == "Concatenate" and _axis(graph, graph.children[m][2]) == axis
        ]
        if inner and nesting < DEPTH:
            kids = graph.children[inner[0]]
            stack += [(kids[0], nesting + 1), (kids[1], nesting + 1)]
            continue
        if not _written(graph, cls, block):
            return False
    return True


def _written(graph, cls: int, block: bool) -> bool:
    """Whether e-class `cls` holds a product (or, in a contiguous block, a map), possibly
    below layout ops."""
    frontier = [cls]
    for _ in range(DEPTH):
        below = []
        for c in frontier:
            for m in graph.class_nodes[c]:
                op = graph.ops[m]
                if op in PRODUCTS or (block and op in MAPS):
                    return True
                if op in THROUGH:
                    below.append(graph.children[m][0])
        if not below:
            return False
        frontier = below
    return False


def _axis(graph, cls: int) -> int | None:
    nodes = graph.class_nodes[cls]
    try:
        return int(graph.ops[nodes[0]]) if nodes else None
    except ValueError:
        return None


__all__ = ["in_place_parts"]
