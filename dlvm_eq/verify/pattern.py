"""Rule-file vocabulary: term patterns, declared signatures, and what verify-rules knows.

    to_pattern(read("(Exp (Log x))")[0])    # PCall('Exp', (PCall('Log', (PVar('x'),)),))
    vocab = Vocab(); declarations(forms, vocab)

Known meanings: the IR ops of schema.egg (via the op table), `Const`, `Adjoint`, the helpers
of helpers.py, macros (constructors one unconditional rewrite defines), the analyses `shape`,
`dtype` and `cval`, the sign relations `positive`/`nonneg`/`nonzero`, tables of primitive
functions set at top level, and egglog's primitives (PRIMS).

Scalar forms of the IR ops (rules/fusion.egg): a constructor named "S" + an IR op's schema
constructor, declared with that constructor's argument sorts except Term -> its own result
sort (`(SAdd Scalar Scalar)`, `(SBroadcast Scalar IVec)`), means the op itself. A term of any
sort that constructors build (Term, Scalar) denotes a tensor: a scalar expression is the
tensor of its values at every index, so `(Load t)` and `(Map s)` are identities (helpers.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..egraph.serialized import EGG_TO_OP
from ..sexpr import SList, Str, Sym, show
from .helpers import FUNCTIONS, HELPERS

# Relations that state a sign fact about a term; as facts they are assumptions on the symbols,
# as actions they are claims to verify. Rule files declare them, e.g. `(relation positive (Term))`.
ASSUMPTIONS = {"positive": "> 0", "nonneg": ">= 0", "nonzero": "!= 0"}
# issue 33: (causal-bias t): t's value is the additive causal mask over its last two axes, 0
# where j <= i and -inf above (the loader asserts it on such literals; rules/attention.egg)
ASSUMPTIONS["causal-bias"] = "is the causal mask"
CAUSAL_BIAS = "causal-bias"
# (causal-keep t): t is the bool causal keep mask (True where j <= i on the last two axes)
ASSUMPTIONS["causal-keep"] = "is the causal keep mask"
CAUSAL_KEEP = "causal-keep"
# Relations that state no fact about values: they only narrow which matches a rule takes, so
# a rule is checked without them (a stronger claim) and adding to them claims nothing.
# rules/merge_adjoint.egg: (weight-adjoint x w g), g the adjoint that flowed into x@w.
MATCH_HINTS = {"weight-adjoint"}
LEAF_CTORS = ("Var", "Lit")
SEMANTIC_CTORS = set(EGG_TO_OP) | {"Const", "Adjoint"}
SCALAR_PREFIX = "S"  # "S" + an IR op's constructor: the op on scalars (rules/fusion.egg)
ANALYSES = {"shape": "IVec", "dtype": "String"}  # type-level analyses of schema.egg
CVAL = "cval"  # (cval t) = v: every element of t is the constant v
IGNORED_ACTIONS = {"subsume", "delete", "panic", "extract", "print-function"}

# primitive functions: argument sorts (None: any one numeric sort N shared by all) -> result
VEC = "IVec"
PRIMS: dict[str, tuple] = {
    "vec-of": ("i64*", VEC),
    "vec-empty": ((), VEC),
    "vec-get": ((VEC, "i64"), "i64"),
    "vec-length": ((VEC,), "i64"),
    "vec-push": ((VEC, "i64"), VEC),
    "vec-pop": ((VEC,), VEC),
    "vec-append": ((VEC, VEC), VEC),
    "vec-remove": ((VEC, "i64"), VEC),
    "vec-set": ((VEC, "i64", "i64"), VEC),
    "vec-contains": ((VEC, "i64"), "Unit"),
    "vec-not-contains": ((VEC, "i64"), "Unit"),
    "vec-range": (("i64",), VEC),
    # a gather s[p[i]] over any length: (unstable-vec-map (unstable-fn "vec-get" s) p)
    "unstable-fn": (("String", None), "IFn"),  # the function's name, then what it binds
    "unstable-vec-map": (("IFn", VEC), VEC),
    "+": (None, "N"),
    "-": (None, "N"),
    "*": (None, "N"),
    "/": (None, "N"),
    "%": (None, "N"),
    "min": (None, "N"),
    "max": (None, "N"),
    "neg": (None, "N"),
    "abs": (None, "N"),
    "<": (None, "Unit"),
    ">": (None, "Unit"),
    "<=": (None, "Unit"),
    ">=": (None, "Unit"),
    "to-f64": (("i64",), "f64"),
    "to-i64": (("f64",), "i64"),
    "<<": (("i64", "i64"), "i64"),
    ">>": (("i64", "i64"), "i64"),
    "&": (("i64", "i64"), "i64"),
    "|": (("i64", "i64"), "i64"),
    "^": (("i64", "i64"), "i64"),
    "and": (("bool", "bool"), "bool"),
    "or": (("bool", "bool"), "bool"),
    "not": (("bool",), "bool"),
}
COMPARISONS = {"<", ">", "<=", ">=", "!=", "vec-contains", "vec-not-contains"}
PRIM_SORTS = {"i64", "f64", "String", "bool", VEC, "Unit"}


# ---------------------------------------------------------------- patterns


@dataclass(frozen=True)
class PVar:
    name: str


@dataclass(frozen=True)
class PLit:
    value: object
    sort: str


@dataclass(frozen=True)
class PCall:
    head: str
    args: tuple
    _hash: int = field(default=0, compare=False, repr=False)

    def __post_init__(self):  # terms are dict keys everywhere: hash once, not per lookup
        object.__setattr__(self, "_hash", hash((self.head, self.args)))

    def __hash__(self) -> int:
        return self._hash


def pshow(e) -> str:
    if isinstance(e, PVar):
        return e.name
    if isinstance(e, PLit):
        return show(Str(e.value)) if e.sort == "String" else show(e.value)
    return "(" + " ".join([e.head] + [pshow(a) for a in e.args]) + ")"


class Unsupported(Exception):
    """A construct verify-rules cannot interpret (the rule is reported as skipped)."""


def to_pattern(x):
    if isinstance(x, Str):
        return PLit(str(x), "String")
    if isinstance(x, Sym):
        if x in ("true", "false"):
            return PLit(x == "true", "bool")
        return PVar(str(x))
    if isinstance(x, bool):
        return PLit(x, "bool")
    if isinstance(x, int):
        return PLit(x, "i64")
    if isinstance(x, float):
        return PLit(x, "f64")
    if isinstance(x, SList):
        if not x or not isinstance(x[0], Sym):
            raise Unsupported(f"cannot read {show(x)}")
        if x[0] in LEAF_CTORS:  # a program leaf: an opaque tensor, named by its text
            return PVar(show(x))
        return PCall(str(x[0]), tuple(to_pattern(a) for a in x[1:]))
    raise Unsupported(f"cannot read {x!r}")


def variables(e, out: list | None = None) -> list:
    """Variables of e in post-order of first occurrence (children before parents)."""
    out = [] if out is None else out
    if isinstance(e, PVar):
        if e.name not in out:
            out.append(e.name)
    elif isinstance(e, PCall):
        for a in e.args:
            variables(a, out)
    return out


def substitute(e, defs: dict, depth: int = 0):
    if depth > 64:
        raise Unsupported("definitions of variables are cyclic")
    if isinstance(e, PVar) and e.name in defs:
        return substitute(defs[e.name], defs, depth + 1)
    if isinstance(e, PCall):
        return PCall(e.head, tuple(substitute(a, defs, depth) for a in e.args))
    return e


def subterms(e):
    yield e
    if isinstance(e, PCall):
        for a in e.args:
            yield from subterms(a)


# ---------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Sig:
    name: str
    args: tuple[str, ...]
    result: str
    kind: str  # constructor, function, relation


@dataclass
class Vocab:
    """What rule files declare, and what verify-rules knows the meaning of."""

    sigs: dict = field(default_factory=dict)  # name -> Sig
    tables: dict = field(default_factory=dict)  # function -> {arguments: value} (top-level sets)
    aliases: dict = field(default_factory=dict)  # sort name -> IVec, ...
    macros: dict = field(default_factory=dict)  # constructor -> (parameters, body pattern)

    def is_ctor(self, name: str) -> bool:
        sig = self.sigs.get(name)
        return sig is not None and sig.kind == "constructor"

    def is_hint(self, name: str) -> bool:
        """A relation in MATCH_HINTS, declared as one: it states no fact about values."""
        sig = self.sigs.get(name)
        return sig is not None and sig.kind == "relation" and name in MATCH_HINTS

    def term_sorts(self) -> set[str]:
        """Sorts whose values are tensors: those constructors build (Term, Scalar)."""
        return {sig.result for sig in self.sigs.values() if sig.kind == "constructor"}

    def ir_ctor(self, name: str) -> str | None:
        """The schema constructor of the IR op whose meaning constructor `name` has: itself
        for an IR op; X for a scalar form "S" + X declared with X's argument sorts, its tensor
        sort replaced by the scalar form's own result sort (rules/fusion.egg's SAdd, SBroadcast)."""
        if name in EGG_TO_OP:
            return name
        sig = self.sigs.get(name)
        if sig is None or sig.kind != "constructor" or not name.startswith(SCALAR_PREFIX):
            return None
        base = name[len(SCALAR_PREFIX) :]
        bsig = self.sigs.get(base)
        if base not in EGG_TO_OP or bsig is None or bsig.kind != "constructor":
            return None
        want = tuple(sig.result if a == bsig.result else a for a in bsig.args)
        return base if sig.args == want else None

    def helper(self, name: str):
        """The reference meaning of a helper constructor declared with the expected sorts."""
        h = HELPERS.get(name)
        sig = self.sigs.get(name)
        return h if h is not None and sig is not None and sig.args == h.args else None

    def function(self, name: str):
        """(kind, implementation) of a primitive-valued function call, or None."""
        sig = self.sigs.get(name)
        f = FUNCTIONS.get(name)
        if f is not None and sig is not None and sig.args == f[0]:
            return f[2]
        if name in self.tables:
            table = self.tables[name]
            return lambda *args: table[tuple(args)]
        return None

    def meaning(self, head: str) -> str | None:
        """Why `head` cannot be interpreted, or None when it can."""
        sig = self.sigs.get(head)
        if sig is None:
            if head in PRIMS or head in ("=", "!=", "?defined"):
                return None
            return f"{head} is not a function verify-rules knows"
        if sig.kind == "constructor":
            if (
                head in SEMANTIC_CTORS
                or self.helper(head) is not None
                or head in self.macros
                or self.ir_ctor(head) is not None
            ):
                return None
            if head in HELPERS:
                return (
                    f"constructor {head} is declared ({' '.join(sig.args)}), not "
                    f"({' '.join(HELPERS[head].args)}) as verify-rules defines it"
                )
            base = head[len(SCALAR_PREFIX) :]
            if head.startswith(SCALAR_PREFIX) and base in EGG_TO_OP and base in self.sigs:
                want = " ".join(
                    sig.result if a == self.sigs[base].result else a for a in self.sigs[base].args
                )
                return (
                    f"constructor {head} is declared ({' '.join(sig.args)}); as the scalar "
                    f"form of {base} verify-rules expects ({want})"
                )
            return (
                f"constructor {head} has no meaning known to verify-rules (only the IR ops "
                "of schema.egg and their scalar forms S<op>, Const, Adjoint and the helpers "
                "of verify/helpers.py do)"
            )
        if sig.kind == "function":
            if head in ANALYSES or head == CVAL or self.function(head) is not None:
                return None
            return f"function {head} has no meaning known to verify-rules"
        if head in ASSUMPTIONS or self.is_hint(head):
            return None
        return f"relation {head} has no meaning known to verify-rules"


def _sort_name(x, aliases: dict) -> str:
    name = show(x) if isinstance(x, SList) else str(x)
    return aliases.get(name, name)


def declarations(forms: list, vocab: Vocab) -> None:
    """Add the constructor/function/relation signatures declared in `forms` to vocab."""
    sigs, aliases = vocab.sigs, vocab.aliases
    for f in forms:
        if not isinstance(f, SList) or not f or not isinstance(f[0], Sym):
            continue
        head = f[0]
        if head == "sort" and len(f) >= 3 and isinstance(f[2], SList) and f[2] and f[2][0] == "Vec":
            aliases[str(f[1])] = VEC if str(f[2][1]) == "i64" else f"Vec<{show(f[2][1])}>"
        elif head == "datatype" and len(f) >= 2:
            sort = str(f[1])
            for ctor in f[2:]:
                if isinstance(ctor, SList) and ctor and isinstance(ctor[0], Sym):
                    args = tuple(
                        _sort_name(a, aliases)
                        for a in ctor[1:]
                        if not (isinstance(a, Sym) and a.startswith(":"))
                    )
                    sigs[str(ctor[0])] = Sig(str(ctor[0]), args, sort, "constructor")
        elif head in ("constructor", "function") and len(f) >= 4 and isinstance(f[2], SList):
            args = tuple(_sort_name(a, aliases) for a in f[2])
            sigs[str(f[1])] = Sig(str(f[1]), args, _sort_name(f[3], aliases), str(head))
        elif head == "relation" and len(f) >= 3 and isinstance(f[2], SList):
            sigs[str(f[1])] = Sig(
                str(f[1]), tuple(_sort_name(a, aliases) for a in f[2]), "Unit", "relation"
            )
