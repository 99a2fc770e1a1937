"""Reading egglog's serialized e-graph (extraction-gym JSON) back in terms of IR ops.

`decode(graph, node_id)` turns a Term node into (IR op, term children, attributes);
`class_types` gives every Term e-class its IR type by evaluating the op table's type rules
bottom-up, so the cost model and the unloader never depend on egglog's own analysis.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..errors import IRError
from ..ir import window_ops
from ..ir.op_spec import egg_attrs_from
from ..ir.ops import OPS, WINDOW
from ..ir.registry.egraph_only import EGRAPH_ONLY, IR_FORM, STANDS_FOR
from ..ir.registry.egraph_only import LOOP_MOTION as LOOP_MOTION_ROLE
from ..ir.types import DType, TensorType
from ..records import dataclass

EGG_TO_OP: dict[str, str] = {
    spec.egg: name
    for name, spec in OPS.items()
    if spec.kind not in ("tuple", "call", "literal", "control")
}
# StridedSlice -> slice: an op's other spelling (ir/registry/egraph_only.py); READ_AS ones such
# as Gemm stay out (they are no term of the op, and only extraction's cost model prices them)
EGG_TO_OP.update({e: op for e, op in STANDS_FOR.items() if EGRAPH_ONLY[e].role == IR_FORM})
LEAVES = ("Var", "Const", "Lit")
# rules/loops.egg: in a loop body, a value computed once before the loop (Once) or a row of one
# (StepOf); the unloader makes each a new parameter of the body (egraph/unload.py)
LOOP_MOTION = tuple(e.egg for e in EGRAPH_ONLY.values() if e.role == LOOP_MOTION_ROLE)


@dataclass(frozen=True)
class Decoded:
    """A serialized e-node decoded: its constructor, IR op, child class ids and attributes."""

    egg: str  # constructor name
    op: str | None  # IR op name (None for leaves)
    children: tuple[str, ...]  # node ids of Term children (any node of the child's class)
    attrs: dict[str, Any]


class Graph:
    """A serialized e-graph with helpers; `nodes` is egglog's JSON `nodes` dict."""

    def __init__(self, data: dict | str):
        if isinstance(data, str):
            data = json.loads(data)
        self.data = data
        self.nodes: dict[str, dict] = data["nodes"]
        self.class_data: dict[str, dict] = data.get("class_data", {})
        self.roots: list[str] = list(data.get("root_eclasses", []))
        self.classes: dict[str, list[str]] = {}
        for nid, node in self.nodes.items():
            if node.get("subsumed"):
                continue
            self.classes.setdefault(node["eclass"], []).append(nid)
        self._decoded: dict[str, Decoded] = {}

    def is_term_class(self, eclass: str) -> bool:
        return self.class_data.get(eclass, {}).get("type") == "Term"

    def term_nodes(self, eclass: str) -> list[str]:
        """The e-nodes of a Term class that are constructors (not analysis function entries)."""
        return [n for n in self.classes.get(eclass, []) if self.nodes[n]["op"] in _KNOWN]

    def eclass(self, nid: str) -> str:
        return self.nodes[nid]["eclass"]

    def primitive(self, nid: str):
        node = self.nodes[nid]
        op = node["op"]
        if op == "vec-of":
            return tuple(int(self.primitive(c)) for c in node["children"])
        if op == "vec-empty":
            return ()
        if op.startswith('"'):
            return json.loads(op)
        if op in ("true", "false"):
            return op == "true"
        try:
            return int(op)
        except ValueError:
            return float(op)

    def decode(self, nid: str) -> Decoded:
        d = self._decoded.get(nid)
        if d is None:
            d = self._decoded[nid] = _decode(self, nid)
        return d


def _decode(g: Graph, nid: str) -> Decoded:
    node = g.nodes[nid]
    egg, ch = node["op"], node["children"]
    p = g.primitive
    if egg == "Var":
        return Decoded(egg, None, (), {"name": p(ch[0])})
    if egg == "Const":
        return Decoded(egg, None, (), {"value": float(p(ch[0])), "dtype": DType(p(ch[1]))})
    if egg == "Lit":
        return Decoded(egg, None, (), {"key": p(ch[0])})
    if egg in LOOP_MOTION:  # a loop body's new parameter; its one child is computed before
        return Decoded(egg, None, (ch[2],), {"label": p(ch[0]), "trips": int(p(ch[1]))})
    only = EGRAPH_ONLY.get(egg)
    if only is not None and only.op is not None and only.attrs is not None:
        # Gemm, StridedSlice: an op's other spelling (ir/registry/egraph_only.py)
        prims = tuple(p(c) for c in ch[only.terms :])
        return Decoded(egg, only.op, tuple(ch[: only.terms]), only.attrs(prims))
    op = EGG_TO_OP.get(egg)
    if op is None:
        raise IRError(f"e-graph node {egg!r} has no IR op")
    spec = OPS[op]
    if spec.kind == WINDOW:  # tensor operands, then one IVec of packed attributes
        return Decoded(egg, op, tuple(ch[:-1]), window_ops.unpack(op, p(ch[-1])))
    # the operands, then the attributes as the registry lays them out (OpSpec.egg_attrs)
    n = len(ch) - len(spec.egg_attrs)
    return Decoded(egg, op, tuple(ch[:n]), egg_attrs_from(spec, tuple(p(c) for c in ch[n:])))


_KNOWN = set(EGG_TO_OP) | set(LEAVES)


def leaf_type(
    d: Decoded, var_types: dict[str, TensorType], literals: dict[str, np.ndarray]
) -> TensorType:
    if d.egg == "Var":
        return var_types[d.attrs["name"]]
    if d.egg == "Const":
        return TensorType((), d.attrs["dtype"])
    value = literals[d.attrs["key"]]
    return TensorType(value.shape, DType.from_numpy(value.dtype))


def class_types(
    g: Graph, var_types: dict[str, TensorType], literals: dict[str, np.ndarray]
) -> dict[str, TensorType]:
    """IR type of every Term e-class reachable bottom-up; ill-typed nodes are skipped.
    A worklist: a node is typed once all its child classes are (linear in the e-graph)."""
    types: dict[str, TensorType] = {}
    waiting: dict[str, list[str]] = {}  # child class -> nodes that need its type
    missing: dict[str, int] = {}
    ready: list[str] = []
    for cls, nids in g.classes.items():
        if not g.is_term_class(cls):
            continue
        for nid in nids:
            if g.nodes[nid]["op"] not in _KNOWN:
                continue
            try:
                kids = {g.eclass(c) for c in g.decode(nid).children}
            except (IRError, ValueError, TypeError, IndexError, KeyError, OverflowError):
                continue  # a user's rule built it: rule_origin.check_terms says what is wrong
            if not kids:
                ready.append(nid)
                continue
            missing[nid] = len(kids)
            for k in kids:
                waiting.setdefault(k, []).append(nid)
    while ready:
        nid = ready.pop()
        cls = g.eclass(nid)
        if cls in types:
            continue
        try:  # a node a user's rule built may name no value or type (rule_origin.check_terms)
            d = g.decode(nid)
            if d.op is None:
                types[cls] = leaf_type(d, var_types, literals)
            else:
                types[cls] = OPS[d.op].result_type(
                    [types[g.eclass(c)] for c in d.children], d.attrs
                )
        except (IRError, ValueError, TypeError, IndexError, KeyError, OverflowError):
            continue
        for p in waiting.get(cls, ()):
            missing[p] -= 1
            if missing[p] == 0:
                ready.append(p)
    return types
