"""Rule files as proof obligations: what a rule assumes (facts) and what it claims (actions).

`obligations(text, filename, vocab)` reads every `rewrite`, `birewrite` and `rule` of an egglog
file and normalizes it to an `Obligation`:

    (rewrite (Exp (Log x)) x :when ((positive x)))
    # patterns [(Exp (Log x))], assumptions {x: positive}, claims [union (Exp (Log x)) x]

Facts `(= v E)` define v (it is replaced by E everywhere); other facts are typing patterns,
guards on primitives (`(= (vec-length (shape a)) 2)`, `(< k 3)`) or assumptions
(`(positive x)`, `(= 0.0 (cval z))`). Actions `(union A B)`, `(set (shape E) S)`,
`(set (cval E) v)` and `(positive E)` are claims; `let` is inlined. A rule whose structure is
not understood carries `skip` (a reason); it is never passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sexpr import SList, Sym, read, show
from .pattern import (
    ANALYSES,
    ASSUMPTIONS,
    CAUSAL_BIAS,
    CAUSAL_KEEP,
    COMPARISONS,
    CVAL,
    IGNORED_ACTIONS,
    LEAF_CTORS,
    PRIM_SORTS,
    PRIMS,
    PCall,
    PLit,
    PVar,
    Unsupported,
    Vocab,
    declarations,
    pshow,
    substitute,
    subterms,
    to_pattern,
    variables,
)

# ---------------------------------------------------------------- obligations


@dataclass
class Claim:
    kind: str  # union | set | cval | assume
    lhs: object
    rhs: object
    text: str


@dataclass
class Obligation:
    filename: str
    line: int
    text: str  # the command's source text
    kind: str  # rewrite | birewrite | rule | union | set
    ruleset: str | None = None
    name: str | None = None
    direction: str = ""  # "" or "reversed" (the right-to-left half of a birewrite)
    patterns: list = field(default_factory=list)
    guards: list = field(default_factory=list)
    assumptions: dict = field(default_factory=dict)
    claims: list = field(default_factory=list)
    sorts: dict = field(default_factory=dict)
    constants: dict = field(default_factory=dict)  # tensor variable -> its (cval ...) variable
    skip: str | None = None
    definition: str | None = None  # a top-level set: a table entry, nothing to check
    # a comment `;; verify: numeric -- why` just above the rule: a lemma sympy cannot prove in
    # its time, checked numerically on every assignment without asking sympy
    numeric: str | None = None

    @property
    def where(self) -> str:
        return f"{self.filename}:{self.line}"

    @property
    def mentions_adjoint(self) -> bool:
        return "Adjoint" in self.text


def _options(items: list) -> tuple[list, dict]:
    """Positional items and `:key value` options (`:subsume` has no value)."""
    pos, opts, i = [], {}, 0
    while i < len(items):
        x = items[i]
        if isinstance(x, Sym) and x.startswith(":"):
            if x == ":subsume":
                opts[x] = True
                i += 1
                continue
            opts[str(x)] = items[i + 1] if i + 1 < len(items) else None
            i += 2
            continue
        pos.append(x)
        i += 1
    return pos, opts


LHS = "?lhs"


NUMERIC_MARK = "verify: numeric"


def declared_numeric(lines: list[str], line: int) -> str | None:
    """The reason of a `;; verify: numeric -- reason` comment among the comment lines right
    above line `line` (1-based) of a rule file, or None."""
    k = line - 2
    while k >= 0 and lines[k].lstrip().startswith(";"):
        text = lines[k].lstrip().lstrip(";").strip()
        if text.startswith(NUMERIC_MARK):
            return text[len(NUMERIC_MARK) :].strip(" -—:") or "declared"
        k -= 1
    return None


def obligations(text: str, filename: str, vocab: Vocab) -> list[Obligation]:
    """Every rule of the file as obligations (a birewrite gives two); declarations and
    top-level `set`s of primitive functions (tables) go to vocab."""
    forms = read(text)
    declarations(forms, vocab)
    defining = _macros(forms, vocab)
    lines = text.splitlines()
    out: list[Obligation] = []
    for f in forms:
        if not isinstance(f, SList) or not f or not isinstance(f[0], Sym):
            continue
        head = str(f[0])
        if head not in ("rewrite", "birewrite", "rule", "union", "set"):
            continue
        pos, opts = _options(list(f[1:]))
        base = dict(
            filename=filename,
            line=f.line,
            text=f.text or show(f),
            kind=head,
            ruleset=str(opts[":ruleset"]) if opts.get(":ruleset") is not None else None,
            name=str(opts[":name"]) if opts.get(":name") is not None else None,
            numeric=declared_numeric(lines, f.line),
        )
        if head == "set" and _table_entry(f, vocab):
            out.append(Obligation(**base, definition=f"a value of {f[1][0]}"))
            continue
        if head in ("union", "set"):
            out.append(Obligation(**base, skip=f"a top-level {head} (not a rule) is not verified"))
            continue
        if id(f) in defining:
            out.append(
                Obligation(
                    **base, definition=f"defines {defining[id(f)]} (expanded wherever it occurs)"
                )
            )
            continue
        when = opts.get(":when")
        facts = list(when) if isinstance(when, SList) else []
        if head == "rule":
            if len(pos) != 2 or not isinstance(pos[0], SList) or not isinstance(pos[1], SList):
                out.append(Obligation(**base, skip="a rule needs a list of facts and of actions"))
                continue
            out.append(_build(base, list(pos[0]), list(pos[1]), vocab))
            continue
        if len(pos) != 2:
            out.append(Obligation(**base, skip=f"{head} needs a left and a right side"))
            continue
        lhs, rhs = pos
        pairs = [(lhs, rhs, "")] + ([(rhs, lhs, "reversed")] if head == "birewrite" else [])
        for a, b, direction in pairs:
            eq = SList([Sym("="), Sym(LHS), a], f.line, f.col)
            union = SList([Sym("union"), Sym(LHS), b], f.line, f.col)
            ob = _build(base, [eq] + facts, [union], vocab)
            ob.direction = direction
            out.append(ob)
    return out


def _root_head(f: SList):
    """The constructor a rewrite or rule rewrites from (its left side's head), if any."""
    if f[0] in ("rewrite", "birewrite") and len(f) > 1 and isinstance(f[1], SList) and f[1]:
        return str(f[1][0])
    if f[0] == "rule" and len(f) > 1 and isinstance(f[1], SList):
        for fact in f[1]:
            if (
                isinstance(fact, SList)
                and len(fact) == 3
                and fact[0] == "="
                and isinstance(fact[2], SList)
                and fact[2]
            ):
                return str(fact[2][0])
    return None


def _macros(forms: list, vocab: Vocab) -> dict:
    """Constructors without a known meaning that one unconditional rewrite defines:
    `(rewrite (H x y) body)`. They are expanded wherever they occur. {id(form): name}."""
    uses: dict[str, list] = {}
    for f in forms:
        if isinstance(f, SList) and f and f[0] in ("rewrite", "birewrite", "rule"):
            h = _root_head(f)
            if h is not None:
                uses.setdefault(h, []).append(f)
    defining = {}
    for h, fs in uses.items():
        if (
            len(fs) != 1
            or vocab.meaning(h) is None
            or not vocab.is_ctor(h)
            or fs[0][0] != "rewrite"
        ):
            continue
        f = fs[0]
        pos, opts = _options(list(f[1:]))
        if len(pos) != 2 or ":when" in opts:
            continue
        try:
            lhs, body = to_pattern(pos[0]), to_pattern(pos[1])
        except Unsupported:
            continue
        params = [a.name for a in lhs.args if isinstance(a, PVar)]
        if len(params) != len(lhs.args) or len(set(params)) != len(params):
            continue
        if any(isinstance(t, PCall) and t.head == h for t in subterms(body)):
            continue
        vocab.macros[h] = (params, body)
        defining[id(f)] = h
    return defining


def expand_macros(e, vocab: Vocab, depth: int = 0):
    if not isinstance(e, PCall):
        return e
    if depth > 32:
        raise Unsupported("macro expansion nests too deeply")
    args = tuple(expand_macros(a, vocab, depth) for a in e.args)
    m = vocab.macros.get(e.head)
    if m is None:
        return PCall(e.head, args)
    params, body = m
    return expand_macros(_instantiate(body, dict(zip(params, args))), vocab, depth + 1)


def _instantiate(e, binding: dict):
    """e with its variables replaced at once (no re-substitution of the replacements)."""
    if isinstance(e, PVar):
        return binding.get(e.name, e)
    if isinstance(e, PCall):
        return PCall(e.head, tuple(_instantiate(a, binding) for a in e.args))
    return e


def _table_entry(f: SList, vocab: Vocab) -> bool:
    """Record `(set (fn lit ...) lit)` for a function of primitives; True if it was one."""
    if len(f) != 3 or not isinstance(f[1], SList) or not f[1] or not isinstance(f[1][0], Sym):
        return False
    sig = vocab.sigs.get(str(f[1][0]))
    if sig is None or sig.kind != "function" or any(a not in PRIM_SORTS for a in sig.args):
        return False
    try:
        args = [to_pattern(a) for a in f[1][1:]]
        value = to_pattern(f[2])
    except Unsupported:
        return False
    if not all(isinstance(a, PLit) for a in args + [value]):
        return False
    vocab.tables.setdefault(sig.name, {})[tuple(a.value for a in args)] = value.value
    return True


def _build(base: dict, facts: list, actions: list, vocab: Vocab) -> Obligation:
    ob = Obligation(**base)
    try:
        _normalize(ob, facts, actions, vocab)
    except Unsupported as e:
        ob.skip = str(e)
    return ob


def _is_term(p, vocab: Vocab) -> bool:
    """A tensor term: a constructor's application, or a leaf (`(Var n)`, `(Lit v)`, kept as a
    variable named by its text)."""
    if isinstance(p, PCall):
        return vocab.is_ctor(p.head)
    return isinstance(p, PVar) and p.name.startswith(tuple(f"({c} " for c in LEAF_CTORS))


def _normalize(ob: Obligation, facts: list, actions: list, vocab: Vocab) -> None:
    defs: dict[str, object] = {}
    raw_guards, raw_patterns, raw_assume = [], [], []
    for fact in facts:
        p = to_pattern(fact)
        if isinstance(p, PCall) and p.head == "=" and len(p.args) == 2:
            a, b = p.args
            if isinstance(a, PVar) and a.name not in defs and a.name not in variables(b):
                defs[a.name] = b
            elif isinstance(b, PVar) and b.name not in defs and b.name not in variables(a):
                defs[b.name] = a
            else:
                raw_guards.append(p)
        elif isinstance(p, PCall) and p.head in ASSUMPTIONS and len(p.args) == 1:
            raw_assume.append(p)
        elif isinstance(p, PCall) and p.head in COMPARISONS:
            raw_guards.append(p)
        elif isinstance(p, PCall) and vocab.is_hint(p.head):
            continue  # it narrows the matches only: checked without it, the claim is stronger
        elif isinstance(p, PCall) and p.head in ANALYSES and len(p.args) == 1:
            raw_patterns.append(p.args[0])
        elif isinstance(p, PCall) and vocab.is_ctor(p.head):
            raw_patterns.append(p)
        else:
            head = p.head if isinstance(p, PCall) else pshow(p)
            raise Unsupported(f"fact {pshow(p)}: verify-rules does not know what {head} means")

    for v, e in defs.items():  # a defined variable stands for its definition everywhere
        if isinstance(e, PCall) and not vocab.is_ctor(e.head):
            raw_guards.append(PCall("?defined", (PVar(v),)))
        else:
            raw_patterns.append(PVar(v))
    ob.patterns = [substitute(p, defs) for p in raw_patterns]
    # (!= a b) of two terms: egglog's e-classes differ, which no value states (a weight merged
    # with itself is still an identity): it narrows the matches only, checked without it
    ob.guards = [
        g
        for g in (substitute(g, defs) for g in raw_guards)
        if not (isinstance(g, PCall) and g.head == "!=" and any(_is_term(a, vocab) for a in g.args))
    ]
    for a in raw_assume:
        target = substitute(a.args[0], defs)
        if not isinstance(target, PVar):
            raise Unsupported(
                f"assumption {pshow(a)} is about a compound term; "
                "only variables can be assumed " + ASSUMPTIONS[a.head]
            )
        ob.assumptions[target.name] = a.head
        ob.patterns.append(target)

    lets: dict[str, object] = dict(defs)
    for act in actions:
        p = to_pattern(act)
        if not isinstance(p, PCall):
            raise Unsupported(f"action {pshow(p)} is not understood")
        if p.head == "let" and len(p.args) == 2 and isinstance(p.args[0], PVar):
            lets[p.args[0].name] = substitute(p.args[1], lets)
        elif p.head == "union" and len(p.args) == 2:
            lhs, rhs = substitute(p.args[0], lets), substitute(p.args[1], lets)
            ob.claims.append(Claim("union", lhs, rhs, f"{pshow(lhs)} = {pshow(rhs)}"))
        elif p.head == "set" and len(p.args) == 2 and isinstance(p.args[0], PCall):
            fn = substitute(p.args[0], lets)
            value = substitute(p.args[1], lets)
            text = f"{pshow(fn)} = {pshow(value)}"
            if fn.head == CVAL and len(fn.args) == 1:
                ob.claims.append(Claim("cval", fn.args[0], value, text))
            elif fn.head in ANALYSES or (
                vocab.sigs.get(fn.head) is not None and vocab.function(fn.head) is not None
            ):
                ob.claims.append(Claim("set", fn, value, text))
            else:
                raise Unsupported(
                    f"action {pshow(p)} sets {fn.head}, whose meaning verify-rules does not know"
                )
        elif p.head in ASSUMPTIONS and len(p.args) == 1:
            target = substitute(p.args[0], lets)
            ob.claims.append(Claim("assume", target, p.head, f"({p.head} {pshow(target)})"))
        elif p.head in IGNORED_ACTIONS or vocab.is_ctor(p.head) or vocab.is_hint(p.head):
            continue  # no equality is claimed
        else:
            raise Unsupported(f"action {pshow(p)} is not understood")
    if vocab.macros:
        ob.patterns = [expand_macros(p, vocab) for p in ob.patterns]
        ob.guards = [expand_macros(g, vocab) for g in ob.guards]
        for c in ob.claims:
            c.lhs = expand_macros(c.lhs, vocab)
            if c.kind != "assume":
                c.rhs = expand_macros(c.rhs, vocab)
    for e in _claim_exprs(ob) + ob.patterns + ob.guards:
        for t in subterms(e):
            if isinstance(t, PCall):
                why = vocab.meaning(t.head)
                if why:
                    raise Unsupported(why)
    _constants(ob)
    ob.sorts = infer_sorts(ob, vocab.sigs)
    for g in ob.guards:
        if g.head == "=" and any(
            _sort_of(a, ob.sorts, vocab.sigs) not in PRIM_SORTS for a in g.args
        ):
            raise Unsupported(
                f"fact {pshow(g)} equates two terms; verify-rules only "
                "interprets such facts as definitions of a variable"
            )


def _claim_exprs(ob: Obligation) -> list:
    out = []
    for c in ob.claims:
        out.append(c.lhs)
        if c.kind != "assume":
            out.append(c.rhs)
    return out


def _constants(ob: Obligation) -> None:
    """(cval x) of a variable x becomes a variable `cval:x`: x is then the constant tensor."""

    def walk(e):
        if isinstance(e, PCall):
            if e.head == CVAL:
                (x,) = e.args
                if not isinstance(x, PVar):
                    raise Unsupported(f"{pshow(e)}: only (cval x) of a variable x can be assumed")
                name = f"cval:{x.name}"
                ob.constants[x.name] = name
                return PVar(name)
            return PCall(e.head, tuple(walk(a) for a in e.args))
        return e

    ob.patterns = [walk(p) for p in ob.patterns]
    ob.guards = [walk(g) for g in ob.guards]
    for c in ob.claims:
        c.lhs = walk(c.lhs)
        if c.kind != "assume":
            c.rhs = walk(c.rhs)
    for x, name in ob.constants.items():
        ob.patterns.append(PVar(x))
        kind = ob.assumptions.get(x)
        if kind in (CAUSAL_BIAS, CAUSAL_KEEP):  # a scalar constant is no mask over two axes
            raise Unsupported(f"({kind} {x}) on a scalar constant")
        if kind:  # a constant assumed positive: the constant must be
            op = {"positive": ">", "nonneg": ">=", "nonzero": "!="}[kind]
            ob.guards.append(PCall(op, (PVar(name), PLit(0.0, "f64"))))


# ---------------------------------------------------------------- sorts


def _sort_of(e, sorts: dict, sigs: dict):
    if isinstance(e, PVar):
        return sorts.get(e.name)
    if isinstance(e, PLit):
        return e.sort
    sig = sigs.get(e.head)
    if sig is not None:
        return sig.result
    prim = PRIMS.get(e.head)
    if prim is None:
        return "Unit"
    if prim[1] == "N":
        for a in e.args:
            s = _sort_of(a, sorts, sigs)
            if s is not None:
                return s
        return None
    return prim[1]


def infer_sorts(ob: Obligation, sigs: dict) -> dict:
    """The sort of every variable, from the positions it occurs in."""
    sorts: dict[str, str] = {}

    def record(name, sort):
        if sort is None or sort == "N":
            return
        old = sorts.get(name)
        if old is not None and old != sort:
            raise Unsupported(f"variable {name} is used both as {old} and as {sort}")
        sorts[name] = sort

    def walk(e, expected=None):
        if isinstance(e, PVar):
            record(e.name, expected)
            return
        if not isinstance(e, PCall):
            return
        sig = sigs.get(e.head)
        if sig is not None:
            for a, s in zip(e.args, sig.args):
                walk(a, s)
            return
        if e.head in ("=", "!=", "?defined") or PRIMS.get(e.head, (None,))[0] is None:
            shared = None
            for a in e.args:
                shared = shared or _sort_of(a, sorts, sigs)
            if shared is None and PRIMS.get(e.head, (None, None))[1] == "N":
                shared = expected
            for a in e.args:
                walk(a, shared)
            return
        args, _ = PRIMS[e.head]
        if args == "i64*":
            args = ("i64",) * len(e.args)
        for a, s in zip(e.args, args):
            walk(a, s)

    exprs = list(ob.patterns) + list(ob.guards)
    for c in ob.claims:
        exprs += [c.lhs] + ([c.rhs] if c.kind != "assume" else [])
    for name in ob.assumptions:
        record(name, "Term")
    for x, name in ob.constants.items():
        record(x, "Term")
        record(name, "f64")
    for _ in range(4):
        for e in exprs:
            walk(e)
        for c in ob.claims:
            if c.kind == "union":
                s = _sort_of(c.lhs, sorts, sigs) or _sort_of(c.rhs, sorts, sigs)
                walk(c.lhs, s)
                walk(c.rhs, s)
            elif c.kind == "set":
                walk(c.rhs, sigs[c.lhs.head].result)
            elif c.kind == "cval":
                walk(c.lhs, "Term")
                walk(c.rhs, "f64")
    for e in exprs:
        for v in variables(e):
            if v not in sorts:
                raise Unsupported(f"cannot tell the sort of variable {v}")
    return sorts
