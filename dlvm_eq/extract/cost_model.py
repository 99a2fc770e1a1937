"""Cost models: what one e-node costs. Extractors ask once per e-node, then work on a list.

A cost model is anything with ``node_cost(graph, node_id) -> float``, or a plain callable
``cost(graph, node_id) -> float`` (egglog-python's convention: cost models are callables).
``float("inf")`` forbids an e-node (e.g. an op a target cannot run); negative costs are refused
because a DAG cost must not improve by pulling in more e-nodes.

>>> from dlvm_eq.extract.graph import load_json
>>> g = load_json({"nodes": {"a": {"op": "Exp", "children": [], "eclass": "A", "cost": 3.0}}})
>>> node_costs(g, None), node_costs(g, lambda graph, nid: 2.0 if graph.raw_nodes[nid]["op"] == "Exp" else 1.0)
([3.0], [2.0])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .extraction_error import ExtractionError
from .graph import SerializedEGraph


@runtime_checkable
class CostModel(Protocol):
    """The cost of one e-node of a serialized e-graph (``node_id`` is the JSON e-node id)."""

    def node_cost(self, graph: SerializedEGraph, node_id: str) -> float: ...


class FieldCost:
    """The default: the JSON ``"cost"`` field (Tensat's measured operator times; egglog's costs)."""

    def node_cost(self, graph: SerializedEGraph, node_id: str) -> float:
        return graph.costs[graph.node_index[node_id]]


CostLike = CostModel | Callable[[SerializedEGraph, str], float] | None


def node_costs(graph: SerializedEGraph, cost: CostLike = None) -> list[float]:
    """Every e-node's cost, indexed like ``graph.node_ids``; checked finite-or-inf and >= 0."""
    if cost is None or isinstance(cost, FieldCost):
        out = list(graph.costs)
        _check(graph, out)
        return out
    if isinstance(cost, CostModel):
        fn = cost.node_cost
    elif callable(cost):
        fn = cost
    else:
        raise ExtractionError(
            f"cost must be a CostModel or a callable (graph, node_id) -> float, "
            f"not {type(cost).__name__}"
        )
    out = [float(fn(graph, nid)) for nid in graph.node_ids]
    _check(graph, out)
    return out


def _check(graph: SerializedEGraph, costs: list[float]) -> None:
    for nid, c in zip(graph.node_ids, costs):
        if math.isnan(c) or c < 0:
            raise ExtractionError(
                f"cost of e-node {nid!r} is {c}; costs must be >= 0 (inf forbids)"
            )
