"""Program values bound as rows of one marker function, not as egglog globals.

The loaders (loader.py, fusion_decision.py, ad/driver.py) build one Let (lets.py) per IR
value. An egglog 13.2 global is a table of its own, and egglog's per-command work, every
saturation iteration, push/pop and serialization walk all tables: time grows with the square
of the number of values (measured on a tanh chain with the schema's analysis, lets + analysis
+ serialize with every value a root: 10k values 4.4 s, 30k values 39.7 s). Bound instead as
rows of one function,

    (function dlvm-value (i64) Term :merge old)
    (let $p0_12_ (Add $p0_3_ $p0_4_))  ->  (set (dlvm-value 12) (Add (dlvm-value 3) (dlvm-value 4)))

the same program takes 1.3 s and 3.4 s. A row is a lookup of the value's e-class (a function,
not a constructor: it adds no e-node, so node counts and budgets are unchanged, and no rule
matches it). The session keeps the names on the Python side (`BoundValues`): Lets are written
with their rows straight from the data (`bind`), and hand-written text that names `$name`s
is read through them (`refer`, `bind_lines`); serialized e-graphs drop the marker's rows
(`drop_markers`), so extraction sees the same nodes as with globals.

    values = BoundValues()
    text = values.bind(prog.lets)             # (set (dlvm-value 0) (Var "x")) ...
    values.bind_lines(['(let $a_ (Var "y"))', "(let $b_ (Tanh $a_))"])
    values.row("$b_")     # the row of $b_
"""

from __future__ import annotations

import math
import re

from ..errors import DlvmError
from .lets import Let, commands

# False: bind values as egglog globals, as before this module (tests compare the two ways)
BIND_AS_ROWS = True
MARKER = "dlvm-value"  # lower case: node_count counts capitalized constructors only
MARKER_DECLARATION = f"(function {MARKER} (i64) Term :merge old)\n"

# a string literal (left alone: a name inside it is text) or a `$name`
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\$[^\s()"]+')
_LET = re.compile(r'\(let (\$[^\s()"]+) ')


class BoundValues:
    """Our let names -> marker rows, undone by (pop) as egglog undoes the rows."""

    def __init__(self, marker: str = MARKER):
        self.marker = marker
        self.rows: dict[str, int] = {}
        self.order: list[str] = []  # names in binding order, for pop
        self.marks: list[int] = []  # len(order) at each push

    def row(self, name: str) -> int | None:
        return self.rows.get(name)

    def push(self) -> None:
        self.marks.append(len(self.order))

    def pop(self) -> None:
        if not self.marks:
            return  # egglog reports the unmatched pop itself
        keep = self.marks.pop()
        for name in self.order[keep:]:
            del self.rows[name]
        del self.order[keep:]

    def _ref(self, m: re.Match) -> str:
        tok = m.group(0)
        if tok[0] == '"':
            return tok
        row = self.rows.get(tok)
        # a name we did not bind (a global of a rule file or a test) is egglog's own
        return tok if row is None else f"({self.marker} {row})"

    def refer(self, text: str) -> str:
        """`text` with every `$name` we bound read as its marker row."""
        return _TOKEN.sub(self._ref, text)

    def _new_row(self, name: str) -> int:
        if name in self.rows:
            raise DlvmError(f"e-graph value {name} is bound twice (a loader bug)")
        row = len(self.order)
        self.rows[name] = row
        self.order.append(name)
        return row

    def ref(self, let: Let) -> str:
        """How egglog text names a Let: its marker row, or its name if we did not bind it."""
        row = self.rows.get(let.name)
        return let.name if row is None else f"({self.marker} {row})"

    def bind(self, lets, facts: bool = True) -> str:
        """Lets (lets.py) as egglog text: each a marker row (with its leaves' shapes and
        dtypes when `facts`), written straight from the data."""
        if not BIND_AS_ROWS:
            return "\n".join(commands(lets, facts)) + "\n"
        out = []
        for let in lets:
            body = let.term(self.ref)  # before its own row: a let never reads itself
            out.append(f"(set ({self.marker} {self._new_row(let.name)}) {body})")
            if facts:
                out.extend(let.facts(self.ref))
        return "\n".join(out) + "\n"

    def bind_lines(self, lines: list[str]) -> str:
        """One-command lines as egglog text: a line `(let $name term)` becomes a marker row
        (text written by hand; loaders send Lets to `bind`, and tests check that both give
        egglog the same commands)."""
        if not BIND_AS_ROWS:
            return "\n".join(lines) + "\n"
        out = []
        for line in lines:
            m = _LET.match(line)
            if m is None:
                out.append(self.refer(line))
                continue
            body = self.refer(line[m.end() :])
            out.append(f"(set ({self.marker} {self._new_row(m.group(1))}) {body}")
        return "\n".join(out) + "\n"


def drop_markers(data: dict, marker: str = MARKER) -> None:
    """Remove the marker's rows from a serialized e-graph (in place). A child that points at a
    row points at another node of its class instead; an i64 node only a row used goes too. A
    row alone in its class (the rest cut by a row cap) stays, costed infinite."""
    nodes = data["nodes"]
    rows = [nid for nid, d in nodes.items() if d["op"] == marker]
    if not rows:
        return
    rows_set = set(rows)
    other: dict[str, str] = {}  # class -> a node of it that is not a row
    for nid, d in nodes.items():
        if nid not in rows_set:
            other.setdefault(d["eclass"], nid)
    instead = {}
    for nid in rows:
        alt = other.get(nodes[nid]["eclass"])
        if alt is None:
            nodes[nid]["cost"] = math.inf
        else:
            instead[nid] = alt
    if not instead:
        return
    used: set[str] = set()
    for nid, d in nodes.items():
        if nid in instead:
            continue
        kids = d["children"]
        if any(k in instead for k in kids):
            d["children"] = kids = [instead.get(k, k) for k in kids]
        used.update(kids)
    class_data = data.get("class_data", {})
    for nid in instead:
        for k in nodes.pop(nid)["children"]:
            if k not in used and k in nodes and k.startswith("primitive-"):
                class_data.pop(nodes.pop(k)["eclass"], None)  # a primitive is its own class
