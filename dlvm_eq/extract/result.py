"""The result of an extraction: the choice, its costs, how it was obtained, and its terms.

>>> from dlvm_eq.extract import extract, load_json
>>> g = load_json({"nodes": {
...     "x": {"op": "x", "children": [], "eclass": "X", "cost": 1.0},
...     "f": {"op": "f", "children": ["x", "x"], "eclass": "F", "cost": 2.0}},
...     "root_eclasses": ["F"]})
>>> r = extract(g)
>>> r.choice, r.dag_cost, r.tree_cost, r.term()
({'X': 'x', 'F': 'f'}, 3.0, 4.0, '(f x x)')
"""

from __future__ import annotations

from dataclasses import field

from ..records import dataclass
from .extraction_error import ExtractionError
from .graph import SerializedEGraph


@dataclass(frozen=True)
class Extraction:
    """One chosen e-node per e-class reachable from the roots (and only those)."""

    choice: dict[str, str]  # e-class id -> e-node id
    dag_cost: float  # each chosen e-node once
    tree_cost: float  # the terms unfolded: shared e-nodes once per use
    method: str  # "greedy", "ilp" or "tree"
    seconds: float  # wall time of the extraction itself (not of loading)
    roots: tuple[str, ...] = ()
    fallback: bool = False  # the ILP's answer was replaced by the greedy one
    status: str = "ok"  # what the extractor says ("optimal", "time limit, ...")
    optimal: bool = False  # proven optimal (only the ILP proves anything)
    graph: SerializedEGraph | None = field(default=None, repr=False, compare=False)

    def term(self, eclass: str | None = None, max_chars: int = 1_000_000) -> str:
        """The extracted term of ``eclass`` (default: the first root) as an s-expression.

        Shared subterms are printed at each use, so a deep DAG can print very large: past
        ``max_chars`` this raises instead of exhausting memory.
        """
        if self.graph is None:
            raise ExtractionError("this Extraction has no graph to print terms from")
        g = self.graph
        if eclass is None:
            if not self.roots:
                raise ExtractionError("no root e-class to print")
            eclass = self.roots[0]
        if eclass not in self.choice:
            raise ExtractionError(f"e-class {eclass!r} is not part of this extraction")
        text: dict[str, str] = {}
        stack = [eclass]
        while stack:  # iterative post-order: real e-graphs nest deeper than the recursion limit
            c = stack[-1]
            nid = self.choice[c]
            kids = g.node_children[nid]
            todo = [k for k in kids if k not in text]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            if c in text:
                continue
            op = g.ops[g.node_index[nid]]
            if kids:
                text[c] = "(" + " ".join([op] + [text[k] for k in kids]) + ")"
            elif nid.startswith("function-"):  # egglog's nullary constructor, e.g. (Nil)
                text[c] = f"({op})"
            else:
                text[c] = op
            if len(text[c]) > max_chars:
                raise ExtractionError(f"term of e-class {eclass!r} exceeds {max_chars} characters")
        return text[eclass]
