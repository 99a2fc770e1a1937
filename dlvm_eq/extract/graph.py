"""A serialized e-graph (egglog's JSON, the extraction-gym format) loaded into integer arrays.

The JSON names e-nodes and e-classes with strings; extractors work on dense integer indices
(node ``i`` is ``graph.node_ids[i]``, class ``c`` is ``graph.class_ids[c]``) so that their hot
loops index lists instead of hashing strings.

>>> g = load_json({"nodes": {
...     "x": {"op": "x", "children": [], "eclass": "X", "cost": 1.0},
...     "f": {"op": "f", "children": ["x", "x"], "eclass": "F", "cost": 2.0}},
...     "root_eclasses": ["F"]})
>>> g.classes["F"], g.node_children["f"], g.root_eclasses
(('f',), ('X', 'X'), ('F',))
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import field
from functools import cached_property
from typing import Any

from ..records import dataclass
from .extraction_error import ExtractionError


@dataclass(frozen=True, eq=False)
class SerializedEGraph:
    """A loaded e-graph; build it with :func:`load_json`.

    Subsumed e-nodes are left out of ``node_ids`` (egglog forbids extracting them), but their
    e-classes stay: another e-node may still point at them.
    """

    node_ids: tuple[str, ...]
    ops: tuple[str, ...]
    costs: tuple[float, ...]  # the JSON "cost" field of each e-node
    node_class: tuple[int, ...]  # node index -> class index
    children: tuple[tuple[int, ...], ...]  # node index -> child class indices, argument order
    class_ids: tuple[str, ...]
    class_nodes: tuple[tuple[int, ...], ...]  # class index -> its (non-subsumed) node indices
    roots: tuple[int, ...]  # the JSON "root_eclasses", as class indices
    node_index: Mapping[str, int] = field(repr=False)
    class_index: Mapping[str, int] = field(repr=False)
    raw_nodes: Mapping[str, Mapping[str, Any]] = field(
        repr=False
    )  # the JSON objects, for cost models
    class_data: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def num_nodes(self) -> int:
        return len(self.node_ids)

    @property
    def num_classes(self) -> int:
        return len(self.class_ids)

    # String views, for users and tests; extractors use the integer arrays above.
    @cached_property
    def classes(self) -> dict[str, tuple[str, ...]]:
        """e-class id -> its e-node ids."""
        ids = self.node_ids
        return {c: tuple(ids[n] for n in ns) for c, ns in zip(self.class_ids, self.class_nodes)}

    @cached_property
    def node_eclass(self) -> dict[str, str]:
        """e-node id -> its e-class id."""
        cids = self.class_ids
        return {n: cids[c] for n, c in zip(self.node_ids, self.node_class)}

    @cached_property
    def node_children(self) -> dict[str, tuple[str, ...]]:
        """e-node id -> its children as e-class ids, in argument order."""
        cids = self.class_ids
        return {n: tuple(cids[k] for k in ks) for n, ks in zip(self.node_ids, self.children)}

    @property
    def root_eclasses(self) -> tuple[str, ...]:
        return tuple(self.class_ids[c] for c in self.roots)

    # Derived integer structure shared by the extractors; computed once per graph.
    @cached_property
    def child_sets(self) -> tuple[tuple[int, ...], ...]:
        """node index -> distinct child classes (``f(x, x)`` needs class x once in a DAG)."""
        return tuple(ks if len(ks) < 2 else tuple(dict.fromkeys(ks)) for ks in self.children)

    @cached_property
    def parents(self) -> tuple[tuple[int, ...], ...]:
        """class index -> the nodes that have it as a child (each node listed once)."""
        out: list[list[int]] = [[] for _ in self.class_ids]
        for n, ks in enumerate(self.child_sets):
            for k in ks:
                out[k].append(n)
        return tuple(tuple(p) for p in out)

    def class_ids_of(self, eclasses) -> tuple[int, ...]:
        """e-class ids (strings) -> class indices, with an error naming an unknown one."""
        try:
            return tuple(self.class_index[str(c)] for c in eclasses)
        except KeyError as e:
            raise ExtractionError(f"unknown e-class {e.args[0]!r}") from None


def load_json(source: str | os.PathLike | Mapping[str, Any]) -> SerializedEGraph:
    """Load a serialized e-graph from a path, a JSON string, or an already parsed dict.

    Tolerates what egglog writes beside the gym format: ``subsumed`` flags (those e-nodes are
    dropped), primitive leaves (``"op": "2"``), a missing ``class_data``, and children given
    as e-class ids instead of e-node ids.

    >>> g = load_json('{"nodes": {"a": {"op": "a", "children": [], "eclass": "A", "cost": 0.5}}}')
    >>> g.num_nodes, g.num_classes, g.roots
    (1, 1, ())
    """
    data = _read(source)
    nodes = data.get("nodes")
    if not isinstance(nodes, Mapping):
        raise ExtractionError("serialized e-graph has no 'nodes' object")

    # First pass: every node's e-class, subsumed ones included, so children can be resolved.
    class_index: dict[str, int] = {}
    class_ids: list[str] = []
    eclass_of: dict[str, int] = {}
    for nid, node in nodes.items():
        try:
            cid = str(node["eclass"])
        except (KeyError, TypeError):
            raise ExtractionError(f"e-node {nid!r} has no 'eclass'") from None
        c = class_index.get(cid)
        if c is None:
            c = class_index[cid] = len(class_ids)
            class_ids.append(cid)
        eclass_of[nid] = c

    def child_class(nid: str, child: Any) -> int:
        child = str(child)
        c = eclass_of.get(child)
        if c is None:
            c = class_index.get(child)  # some writers give the child's e-class directly
        if c is None:
            raise ExtractionError(
                f"e-node {nid!r} has a child {child!r} that is neither an e-node nor an e-class"
            )
        return c

    node_ids: list[str] = []
    ops: list[str] = []
    costs: list[float] = []
    node_class: list[int] = []
    children: list[tuple[int, ...]] = []
    for nid, node in nodes.items():
        if node.get("subsumed", False):
            continue
        try:
            cost = float(node.get("cost", 1.0))
        except (TypeError, ValueError):
            raise ExtractionError(
                f"e-node {nid!r} has a non-numeric cost {node.get('cost')!r}"
            ) from None
        if math.isnan(cost):
            raise ExtractionError(f"e-node {nid!r} has cost NaN")
        node_ids.append(nid)
        ops.append(str(node.get("op", "")))
        costs.append(cost)
        node_class.append(eclass_of[nid])
        children.append(tuple(child_class(nid, k) for k in node.get("children", ())))

    class_nodes: list[list[int]] = [[] for _ in class_ids]
    for n, c in enumerate(node_class):
        class_nodes[c].append(n)

    roots = []
    for r in data.get("root_eclasses", ()) or ():
        if str(r) not in class_index:
            raise ExtractionError(f"root e-class {r!r} has no e-nodes in this e-graph")
        roots.append(class_index[str(r)])

    return SerializedEGraph(
        node_ids=tuple(node_ids),
        ops=tuple(ops),
        costs=tuple(costs),
        node_class=tuple(node_class),
        children=tuple(children),
        class_ids=tuple(class_ids),
        class_nodes=tuple(tuple(ns) for ns in class_nodes),
        roots=tuple(dict.fromkeys(roots)),
        node_index={nid: i for i, nid in enumerate(node_ids)},
        class_index=class_index,
        raw_nodes=nodes,
        class_data=data.get("class_data") or {},
    )


def _read(source: str | os.PathLike | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(source, Mapping):
        return source
    if isinstance(source, bytes):
        source = source.decode()
    text = str(source) if not isinstance(source, str) else source
    if isinstance(source, os.PathLike) or not text.lstrip().startswith("{"):
        try:
            with open(text) as f:
                text = f.read()
        except OSError as e:
            raise ExtractionError(
                f"cannot read serialized e-graph {text!r}: {e.strerror}"
            ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ExtractionError(f"serialized e-graph is not JSON: {e}") from None
    if not isinstance(data, Mapping):
        raise ExtractionError("serialized e-graph must be a JSON object")
    return data
