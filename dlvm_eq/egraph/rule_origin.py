"""User rules are not trusted: every e-node is type-checked before extraction may use it, and
an ill-typed one is blamed on the user rules that fired, by file:line.

    check_terms(graph, types, var_types, literals)   # IllTypedTerm: an e-node of another type
    raise blame_user_rules(error, session, saturation_report)   # `error` itself if none fired

The shipped rule files are checked in CI (`dlvm-eq verify-rules --strict`); a user's file is
not, and an ill-typed rule need not leave an ill-typed program: `(Softplus x) -> (Dot x x)`
made softplus(x) - softplus(-x) equal to Dot(x, x) - Dot(x, x), hence to zeros, a well-typed
and wrong program. So every e-node of a Term class must have its class's type by the op table
(checked on the serialized e-graph, where extraction reads it: O(e-nodes), ~1 us each).
Checking the rules statically instead (verify-rules' type check on small shapes) costs ~3 s
per command (sympy, the shipped vocabulary) and misses rules guarded on larger shapes.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import DlvmError, IRError
from ..ir.ops import OPS
from ..ir.registry import EGRAPH_ONLY, read_types
from ..ir.registry.egraph_only import STANDS_FOR
from ..ir.types import DType, TensorType
from ..sexpr import parens
from .serialized import EGG_TO_OP, LEAVES, Graph, leaf_type


class UserRuleError(DlvmError):
    """A user's rule produced a term that is not a valid program (wrong shape or dtype)."""


class IllTypedTerm(DlvmError):
    """An e-node whose type by the op table is not its e-class's (or that has none); the
    constructors involved, to find the rule that built it."""

    def __init__(self, message: str, constructors: set[str]):
        super().__init__(message)
        self.constructors = constructors


def user_rule_files(session) -> list[str]:
    """The rule sources of a session that are not shipped (not checked in CI): file names, or
    names such as "<adjoint rules>" for text."""
    return list(getattr(session, "user_rules", ()))


_BAD = (IRError, ValueError, TypeError, IndexError, KeyError, OverflowError)


def _plain(t) -> tuple:
    """A type as plain data (TensorType's dataclass hash costs ~5x a tuple's)."""
    return (t.shape, t.dtype.value) if isinstance(t, TensorType) else (repr(t),)


def check_terms(g: Graph, types: dict, var_types: dict, literals: dict) -> None:
    """IllTypedTerm at the first e-node of a Term class that does not type-check by the op
    table, or whose type is not its class's (`types`: serialized.class_types). Subsumed
    e-nodes too: a shipped rule that subsumes an ill-typed node (`0*x`, `dot-0`) keeps what it
    implied (measured: x = -x = 0 in one class of well-typed nodes)."""
    plain = {cls: _plain(t) for cls, t in types.items()}
    nodes = g.nodes
    memo: dict = {}  # (op, operand types, attributes) -> type: most e-nodes repeat one
    for nid, node in nodes.items():
        cls = node["eclass"]
        if node["op"] not in _CHECKED or not g.is_term_class(cls):
            continue
        try:
            got = _node_type(g, nid, types, plain, memo, var_types, literals)
        except _BAD as e:
            what = "is not a value of the program" if isinstance(e, KeyError) else str(e)
            raise IllTypedTerm(f"an e-node {node['op']}: {what}", {node["op"]}) from None
        want = plain.get(cls)
        if got is not None and want is not None and got != want:
            ctors = {n["op"] for n in nodes.values() if n["eclass"] == cls}
            kind = lambda p: str(TensorType(p[0], DType(p[1]))) if len(p) == 2 else p[0]
            raise IllTypedTerm(
                f"one e-class holds terms of two types: {node['op']} of type {kind(got)} and "
                f"{' / '.join(sorted(ctors - {node['op']})) or node['op']} of type {kind(want)}",
                ctors,
            )


# the ops, the leaves and the e-graph-only constructors that stand for an op (Gemm)
_CHECKED = set(EGG_TO_OP) | set(LEAVES) | set(STANDS_FOR)


def _node_type(g: Graph, nid: str, types, plain, memo, var_types, literals) -> tuple | None:
    """The plain type of an e-node by the op table; None when an operand's class has none
    (that class is checked on its own)."""
    d = g.decode(nid)
    if d.op is None:
        return _plain(leaf_type(d, var_types, literals))
    classes = [g.nodes[c]["eclass"] for c in d.children]
    kids = tuple(plain.get(c) for c in classes)
    if None in kids:
        return None
    key = (d.egg, kids, _attrs(d.attrs))
    got = memo.get(key)
    if got is None:
        operands = [types[c] for c in classes]
        attrs = d.attrs
        only = EGRAPH_ONLY.get(d.egg)
        if only is not None and only.reads is not None:  # Gemm: the dot of its reads
            operands, attrs = read_types(only, attrs, operands), {}
        got = memo[key] = _plain(OPS[d.op].result_type(operands, attrs))
    return got


def _attrs(attrs: dict):
    """The attributes as a hashable key (repr where a value does not hash)."""
    key = tuple(sorted(attrs.items()))
    try:
        hash(key)
    except TypeError:
        return repr(key)
    return key


def top_level_forms(text: str) -> list[tuple[int, str]]:
    """(line, text) of each top-level parenthesized form; strings and ; comments skipped."""
    forms, depth, start, start_line = [], 0, 0, 1
    for c, i, line, _ in parens(text):
        if c == "(":
            if depth == 0:
                start, start_line = i, line
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0:
                forms.append((start_line, text[start : i + 1]))
    return forms


def _key(text: str) -> str:
    """A rule's text as egglog names it (it quotes strings with ')."""
    return _normal(text).replace('"', "'")


def _normal(text: str) -> str:
    return " ".join(text.split())


def user_rule_locations(session) -> dict[str, tuple[str, int, str]]:
    """{egglog's name of a rule (its :name, or its text): (file, line, its text)} for the
    session's rule files that are not shipped."""
    out: dict[str, tuple[str, int, str]] = {}
    for filename in user_rule_files(session):
        try:
            text = Path(filename).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for line, form in top_level_forms(text):
            head = form[1:].split(None, 1)[0] if len(form) > 2 else ""
            if head not in ("rule", "rewrite", "birewrite"):
                continue
            out[_key(form)] = (filename, line, form)
            if ":name" in form:
                name = form.split(":name", 1)[1].strip().split('"')
                if len(name) >= 2:
                    out[name[1]] = (filename, line, form)
    return out


def blame_user_rules(error: DlvmError, session, saturation) -> DlvmError:
    """`error` with the user rules that fired named (file:line) and verify-rules suggested;
    `error` itself when no user rule fired."""
    fired = getattr(saturation, "rule_matches", None) or {}
    where = user_rule_locations(session)
    hits = []
    for rule, n in sorted(fired.items(), key=lambda kv: (-kv[1], kv[0])):
        loc = where.get(rule) or where.get(_key(rule))
        if loc is not None:
            hits.append((loc, rule, n))
    if not hits:
        return error
    # of the rules that fired, those whose text names a constructor of the ill-typed term
    ctors = getattr(error, "constructors", set())
    named = [h for h in hits if any(re.search(rf"\({re.escape(c)}[\s)]", h[0][2]) for c in ctors)]
    hits = [((f, ln), form, n) for (f, ln, form), _, n in (named or hits)]  # as the user wrote it
    files = sorted({loc[0] for loc, _, _ in hits})
    label = lambda r: _normal(r) if len(_normal(r)) <= 70 else _normal(r)[:67] + "..."
    if len(hits) == 1:
        (file, line), rule, n = hits[0]
        head = f"{file}:{line}: the rule {label(rule)} produced an ill-typed term: {error}"
    else:
        head = (
            f"the optimized program is ill-typed ({error}); rules of yours that fired: "
            + "; ".join(f"{f}:{ln} {label(r)} (x{n})" for (f, ln), r, n in hits)
        )
    return UserRuleError(f"{head}\n  check the rule with: dlvm-eq verify-rules {' '.join(files)}")
