"""Extraction: pick one e-node per e-class of a serialized e-graph so that the program is cheap.

Owns the extractors, the cost models (cost_model.py: the interface; target_cost.py: the
targets' model; fusion_cost.py: kernels) and the machine descriptions. May import ir and the
base modules only: it reads serialized JSON, never an egglog session (egraph calls it).

Works on egglog's serialized JSON (the extraction-gym format). Three extractors:
``"greedy"`` (DAG-aware, default, fast; greedy then a local search of single and pair
switches, `improve.py`), ``"ilp"`` (optimal via ``scipy.optimize.milp``, with a
time limit and a greedy fallback) and ``"tree"`` (bottom-up tree cost, a baseline that pays
for a shared value once per use).

>>> from dlvm_eq.extract import extract, load_json, validate
>>> g = load_json({"nodes": {              # r1 uses x twice (through a and b), r2 is a leaf
...     "x":  {"op": "x", "children": [], "eclass": "X", "cost": 4.0},
...     "a":  {"op": "a", "children": ["x"], "eclass": "A", "cost": 1.0},
...     "b":  {"op": "b", "children": ["x"], "eclass": "B", "cost": 1.0},
...     "r1": {"op": "r1", "children": ["a", "b"], "eclass": "R", "cost": 1.0},
...     "r2": {"op": "r2", "children": [], "eclass": "R", "cost": 10.0}},
...     "root_eclasses": ["R"]})
>>> tree, dag = extract(g, method="tree"), extract(g)   # tree cost of r1 pays x twice: 11 > 10
>>> tree.choice["R"], tree.dag_cost, dag.choice["R"], dag.dag_cost, dag.tree_cost
('r2', 10.0, 'r1', 7.0, 11.0)
>>> extract(g, method="ilp").status
'optimal'
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from ..cache import note_time_cut
from .choice import dag_cost_of, tree_cost_of, walk
from .cost_model import CostLike, CostModel, FieldCost, node_costs
from .extraction_error import ExtractionError
from .graph import SerializedEGraph, load_json
from .greedy import greedy_dag_choice
from .improve import improve_choice
from .result import Extraction
from .tree import tree_choice

__all__ = [
    "extract",
    "dag_cost",
    "tree_cost",
    "validate",
    "load_json",
    "SerializedEGraph",
    "Extraction",
    "ExtractionError",
    "CostModel",
    "FieldCost",
    "METHODS",
]

METHODS = ("greedy", "ilp", "tree")
# the local search's wall-clock safety net: it stops on its work (improve.WORK) far sooner
# (a 32-step GRU's 6k classes: 2-3 s on a loaded machine)
SEARCH_SECONDS = 120.0


def extract(
    graph,
    roots: Iterable[str] | None = None,
    method: str = "greedy",
    cost: CostLike = None,
    time_limit: float = 10.0,
    seconds: float | None = None,
) -> Extraction:
    """Extract the terms of ``roots`` (e-class ids; default: the graph's ``root_eclasses``).

    ``graph`` is a :class:`SerializedEGraph` or anything :func:`load_json` reads.
    ``cost`` is a :class:`CostModel`, a callable ``(graph, node_id) -> float``, or None for the
    JSON cost field. What is extracted depends on the graph and the costs only: greedy's
    local search and the ILP stop on work budgets (improve.WORK, ilp.NODE_LIMIT).
    ``time_limit`` (seconds) is the ILP's safety net, ``seconds`` the local search's (default
    SEARCH_SECONDS); a result either cuts is noted as a time cut (cache.note_time_cut), so
    that it is not cached.
    """
    if not isinstance(graph, SerializedEGraph):
        graph = load_json(graph)
    if method not in METHODS:
        raise ExtractionError(
            f"unknown extraction method {method!r}; expected one of {', '.join(METHODS)}"
        )
    root_ids = _roots(graph, roots)
    start = time.perf_counter()
    costs = node_costs(graph, cost)
    status, optimal, fallback = "ok", False, False
    if method == "tree":
        choice = tree_choice(graph, costs, root_ids)[0]
    else:
        choice = greedy_dag_choice(graph, costs, root_ids)
        if all(choice[r] >= 0 for r in root_ids):  # then switches while the DAG cost drops
            safety = SEARCH_SECONDS if seconds is None else seconds
            choice = improve_choice(graph, costs, choice, root_ids, time_limit=safety)
        if method == "ilp" and all(choice[r] >= 0 for r in root_ids):
            from .ilp import ilp_choice  # scipy (~0.2 s to import) only for the ILP

            res = ilp_choice(graph, costs, root_ids, time_limit=time_limit, greedy=choice)
            choice, status, optimal, fallback = res.choice, res.status, res.optimal, res.fallback
            if "time limit" in status:
                note_time_cut(f"ILP extraction: {status}")
    seconds = time.perf_counter() - start
    for r in root_ids:
        if choice[r] < 0:
            raise ExtractionError(
                f"root e-class {graph.class_ids[r]!r} has no finite, acyclic term"
            )
    order = walk(graph, choice, root_ids)  # every extractor's result is checked here
    return Extraction(
        choice={graph.class_ids[c]: graph.node_ids[choice[c]] for c in order},
        dag_cost=dag_cost_of(costs, choice, order),
        tree_cost=tree_cost_of(graph, costs, choice, order, root_ids),
        method=method,
        seconds=seconds,
        roots=tuple(graph.class_ids[r] for r in root_ids),
        fallback=fallback,
        status=status,
        optimal=optimal,
        graph=graph,
    )


def validate(
    graph: SerializedEGraph, choice: Mapping[str, str], roots: Iterable[str] | None = None
) -> None:
    """Raise :class:`ExtractionError` unless ``choice`` gives every e-class reachable from
    ``roots`` one of its own (non-subsumed) e-nodes, and the chosen e-nodes form no cycle."""
    root_ids = _roots(graph, roots)
    walk(graph, _choice_list(graph, choice), root_ids)


def dag_cost(
    graph: SerializedEGraph,
    choice: Mapping[str, str],
    roots: Iterable[str] | None = None,
    cost: CostLike = None,
) -> float:
    """Sum of the costs of the distinct chosen e-nodes reachable from ``roots`` (validates)."""
    root_ids = _roots(graph, roots)
    c = _choice_list(graph, choice)
    return dag_cost_of(node_costs(graph, cost), c, walk(graph, c, root_ids))


def tree_cost(
    graph: SerializedEGraph,
    choice: Mapping[str, str],
    roots: Iterable[str] | None = None,
    cost: CostLike = None,
) -> float:
    """The cost of the chosen terms unfolded as trees (validates)."""
    root_ids = _roots(graph, roots)
    c = _choice_list(graph, choice)
    return tree_cost_of(graph, node_costs(graph, cost), c, walk(graph, c, root_ids), root_ids)


def _roots(graph: SerializedEGraph, roots) -> tuple[int, ...]:
    if roots is None:
        if not graph.roots:
            raise ExtractionError("no roots: the e-graph has no root_eclasses; pass roots=[...]")
        return graph.roots
    if isinstance(roots, str):
        roots = [roots]
    out = tuple(dict.fromkeys(graph.class_ids_of(roots)))
    if not out:
        raise ExtractionError("no roots given")
    return out


def _choice_list(graph: SerializedEGraph, choice: Mapping[str, str]) -> list[int]:
    out = [-1] * graph.num_classes
    for cid, nid in choice.items():
        c = graph.class_index.get(str(cid))
        if c is None:
            raise ExtractionError(f"choice names unknown e-class {cid!r}")
        n = graph.node_index.get(str(nid))
        if n is None:
            raise ExtractionError(
                f"choice for e-class {cid!r} names unknown (or subsumed) e-node {nid!r}"
            )
        if graph.node_class[n] != c:
            raise ExtractionError(
                f"choice for e-class {cid!r} is e-node {nid!r} of another e-class "
                f"{graph.class_ids[graph.node_class[n]]!r}"
            )
        out[c] = n
    return out
