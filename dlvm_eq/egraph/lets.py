"""A loaded program's values as data: one `Let` per distinct term, written as egglog text only
when it is sent to egglog (values.BoundValues.bind, or `command` for a global).

A Let is a constructor applied to arguments; a Term argument is another Let (so a value used
twice is one object, and every walk over a program is linear in its DAG), any other argument an
attribute: a str (an egglog String), a float (f64), an int (i64) or a tuple of ints (IVec).
A Let without a name is written inline in its user's term (fusion's `(Load x)` Scalars).

    lets = LetTable("v")
    x = lets.let("Var", ("x",), TensorType((3,), F32))
    y = lets.let("Tanh", (x,), x.type)
    lets.let("Tanh", (x,), x.type) is y        # True: interned
    y.command()                                 # '(let $v1_ (Tanh $v0_))'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..ir.types import TensorType

# constructors whose Lets get their shape and dtype set when loaded: the leaves the schema's
# analysis starts from (every other term's shape and dtype follow from its operands)
LEAVES_WITH_FACTS = ("Var", "Lit")
# an array literal whose key holds this is a causal additive mask (loader.causal_mask_value):
# its let also asserts (causal-bias lit), which rules/attention.egg reads
CAUSAL_KEY = "causal"
# ... and one whose key holds this is a causal keep mask (bool: True where key j <= query i),
# asserted as (causal-keep lit)
CAUSAL_KEEP_KEY = "causalkeep"


def let_name(prefix: str, n: int) -> str:
    """The name of the n-th value a loader binds: `$<prefix><n>_`. The trailing `_` is there
    because egglog 13.2 can confuse globals whose names are one another plus digits: with
    `$p0_1` and `$p0_11` both bound and given a shape, `(let $p0_32 (Multiply $p0_11 $p0_1))`
    built w * w instead of a10 * w (a wrong `dlvm-eq query` answer; tests/test_let_names.py).
    A name that ends in `_` is never another name followed by digits. (Sessions bind our lets
    as marker rows, values.py; the names still reach egglog as globals where a caller sends
    `command()` text, e.g. fusion's Scalar result loads.)"""
    return f"${prefix}{n}_"


def egg_float(v: float) -> str:
    """An f64 literal egglog parses back to the same double."""
    v = float(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    text = repr(v)
    return text if any(c in text for c in ".en") else text + ".0"


def egg_vec(xs) -> str:
    return "(vec-of " + " ".join(str(int(x)) for x in xs) + ")" if len(xs) else "(vec-empty)"


def egg_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def attribute_text(a) -> str:
    """An attribute argument as egglog writes it (its Python type says its sort)."""
    if isinstance(a, str):
        return egg_string(a)
    if isinstance(a, float):
        return egg_float(a)
    if isinstance(a, int):
        return str(a)
    if isinstance(a, tuple):
        return egg_vec(a)
    raise TypeError(f"not an egglog attribute: {a!r}")


def by_name(let: Let) -> str:
    return let.name


@dataclass(eq=False, slots=True)  # eq=False: a Let is equal only to itself; never mutated
class Let:
    """One term of a program written for egglog: a constructor, its arguments and type, named or inline."""

    name: str | None  # e.g. "$p0_3_"; None: written inline where it is used
    ctor: str  # the constructor, e.g. "Add"
    args: tuple  # Lets (Term operands) and attributes, in the schema's order
    type: TensorType | None = None

    @property
    def children(self) -> tuple[Let, ...]:
        """The Term operands, in operand order."""
        return tuple(a for a in self.args if isinstance(a, Let))

    def term(self, ref: Callable[[Let], str] = by_name) -> str:
        """`(Ctor ...)`, each named operand written as ref(operand) (its name, or its marker
        row), an inline one as its own term."""
        parts = [self.ctor]
        for a in self.args:
            if isinstance(a, Let):
                parts.append(a.term(ref) if a.name is None else ref(a))
            else:
                parts.append(attribute_text(a))
        return "(" + " ".join(parts) + ")"

    def command(self) -> str:
        """The let as an egglog global: `(let $name (Ctor ...))`."""
        return f"(let {self.name} {self.term()})"

    def facts(self, ref: Callable[[Let], str] = by_name) -> list[str]:
        """The shape and dtype of a leaf (LEAVES_WITH_FACTS), set for the analysis."""
        if self.ctor not in LEAVES_WITH_FACTS or self.type is None:
            return []
        me = ref(self)
        key = str(self.args[0]) if self.ctor == "Lit" else ""
        mask = (
            [f"(causal-keep {me})"]
            if CAUSAL_KEEP_KEY in key
            else [f"(causal-bias {me})"]
            if CAUSAL_KEY in key
            else []
        )
        return [
            f"(set (shape {me}) {egg_vec(self.type.shape)})",
            f"(set (dtype {me}) {egg_string(str(self.type.dtype))})",
        ] + mask


def commands(lets, facts: bool = True) -> list[str]:
    """The lets as egglog globals, one command a line (with their leaves' facts)."""
    out = []
    for let in lets:
        out.append(let.command())
        if facts:
            out.extend(let.facts())
    return out


class LetTable:
    """Builds a program's Lets in order, named `let_name(prefix, n)`. With `intern`, building
    a term twice returns the first Let (keyed by constructor, operand Lets and attributes,
    floats by their egglog text: 0.0 and -0.0 stay apart and two NaNs match, as in egglog)."""

    def __init__(self, prefix: str, intern: bool = True):
        self.prefix = prefix
        self.intern = intern
        self.lets: list[Let] = []
        self._memo: dict[tuple, Let] = {}

    def let(self, ctor: str, args: tuple, t: TensorType | None = None) -> Let:
        key = None
        if self.intern:
            key = (ctor, *map(_key, args))
            hit = self._memo.get(key)
            if hit is not None:
                return hit
        out = Let(let_name(self.prefix, len(self.lets)), ctor, tuple(args), t)
        self.lets.append(out)
        if key is not None:
            self._memo[key] = out
        return out


def _key(a):
    """An argument as the interning key sees it: a float by its egglog text (0.0 and -0.0
    differ, NaN is NaN), an inline Let by its term, anything else as itself."""
    kind = type(a)
    if kind is float:
        return egg_float(a)
    if kind is Let:
        return a if a.name is not None else a.term()
    return a


def inline(ctor: str, args: tuple) -> Let:
    """A term written inside its user's term, not bound on its own."""
    return Let(None, ctor, tuple(args))
