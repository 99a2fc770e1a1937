"""Reading egglog's serialized e-graph (extraction-gym JSON) back in terms of IR ops.

`decode(graph, node_id)` turns a Term node into (IR op, term children, attributes);
`class_types` gives every Term e-class its IR type by evaluating the op table's type rules
bottom-up, so the cost model and the unloader never depend on egglog's own analysis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import IRError
from ..ir import window_ops
from ..ir.ops import OPS, WINDOW
from ..ir.registry.egraph_only import EGRAPH_ONLY, IR_FORM, STANDS_FOR
from ..ir.types import DType, TensorType

EGG_TO_OP: dict[str, str] = {
    spec.egg: name
    for name, spec in OPS.items()
    if spec.kind not in ("tuple", "call", "literal", "control")
}
# StridedSlice -> slice: an op's other spelling (ir/registry/egraph_only.py); READ_AS ones such
# as Gemm stay out (they are no term of the op, and only extraction's cost model prices them)
EGG_TO_OP.update({e: op for e, op in STANDS_FOR.items() if EGRAPH_ONLY[e].role == IR_FORM})
LEAVES = ("Var", "Const", "Lit")


@dataclass(frozen=True)
class Decoded:
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
    spec = EGRAPH_ONLY.get(egg)
    if spec is not None and spec.op is not None and spec.attrs is not None:
        # Gemm, StridedSlice: an op's other spelling (ir/registry/egraph_only.py)
        prims = tuple(p(c) for c in ch[spec.terms :])
        return Decoded(egg, spec.op, tuple(ch[: spec.terms]), spec.attrs(prims))
    op = EGG_TO_OP.get(egg)
    if op is None:
        raise IRError(f"e-graph node {egg!r} has no IR op")
    if egg == "Transpose":
        return Decoded(egg, op, (ch[0],), {"perm": p(ch[1])})
    if egg == "Reduce":
        return Decoded(
            egg,
            op,
            (ch[0],),
            {"combinator": p(ch[1]), "init": float(p(ch[2])), "axes": (int(p(ch[3])),)},
        )
    if egg in ("ShapeCast", "Broadcast"):
        return Decoded(egg, op, (ch[0],), {"shape": p(ch[1])})
    if egg in ("PadShape", "SqueezeShape"):
        return Decoded(egg, op, (ch[0],), {"at": int(p(ch[1]))})
    if egg == "DataTypeCast":
        return Decoded(egg, op, (ch[0],), {"dtype": DType(p(ch[1]))})
    if egg == "Concatenate":
        return Decoded(egg, op, (ch[0], ch[1]), {"axis": int(p(ch[2]))})
    if egg == "Slice":
        return Decoded(
            egg, op, (ch[0],), {"axis": int(p(ch[1])), "lo": int(p(ch[2])), "hi": int(p(ch[3]))}
        )
    if egg == "Take":
        return Decoded(egg, op, (ch[0], ch[1]), {"axis": int(p(ch[2]))})
    if egg == "Cumsum":
        return Decoded(egg, op, (ch[0],), {"axis": int(p(ch[1])), "reverse": bool(int(p(ch[2])))})
    if egg == "SliceScatter":
        return Decoded(
            egg,
            op,
            (ch[0],),
            {
                "axis": int(p(ch[1])),
                "lo": int(p(ch[2])),
                "step": int(p(ch[3])),
                "size": int(p(ch[4])),
            },
        )
    if egg == "ScatterAdd":
        return Decoded(egg, op, (ch[0], ch[1]), {"axis": int(p(ch[2])), "size": int(p(ch[3]))})
    if egg == "Attention":  # issue 33: q, k, v, bias, scale, causal
        return Decoded(egg, op, tuple(ch[:4]), {"scale": float(p(ch[4])), "causal": int(p(ch[5]))})
    if egg == "AttentionBackward":  # q, k, v, bias, o, g, scale, causal, wrt
        attrs = {"scale": float(p(ch[6])), "causal": int(p(ch[7])), "wrt": int(p(ch[8]))}
        return Decoded(egg, op, tuple(ch[:6]), attrs)
    if OPS[op].kind == WINDOW:  # tensor operands, then one IVec of packed attributes
        return Decoded(egg, op, tuple(ch[:-1]), window_ops.unpack(op, p(ch[-1])))
    return Decoded(egg, op, tuple(ch), {})


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
