"""The loaded program as a list of lets: what the reverse pass walks.

The loader (dlvm_eq/egraph/terms.py) emits `(let $v3 (Add $v1 $v2))` per value; every Term
operand is itself a let, so the operands of a let are its top-level `$` arguments, in order.

    >>> read_let('(let $v3 (Reduce $v1 "add" 0.0 1))')
    Let(name='$v3', ctor='Reduce', children=('$v1',), args=('$v1', '"add"', '0.0', '1'))
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Let:
    name: str                    # the let name, e.g. "$p0_3_"
    ctor: str                    # the constructor, e.g. "Add"
    children: tuple[str, ...]    # let names of the Term operands, in operand order
    args: tuple[str, ...] = ()   # every argument as written (attributes too)


def _top_level_args(term: str) -> list[str]:
    """The top-level arguments of `(Ctor a b ...)`; strings and nested terms kept whole."""
    args, depth, start, quoted, escaped = [], 0, None, False, False
    for i, ch in enumerate(term):
        if quoted:
            escaped = ch == "\\" and not escaped
            if ch == '"' and not escaped:
                quoted = False
            continue
        if ch == '"':
            quoted = True
            if depth == 1 and start is None:
                start = i
        elif ch == "(":
            depth += 1
            if depth == 2 and start is None:
                start = i
        elif ch == ")":
            depth -= 1
        if depth == 1 and ch in " \t" or depth == 0:
            if start is not None:
                args.append(term[start:i].strip())
                start = None
        elif depth >= 1 and start is None and ch not in " \t(":
            start = i
    return args


def read_let(line: str) -> Let | None:
    """The Let of one loader line, or None for other commands (`set` of shapes, ...)."""
    if not line.startswith("(let "):
        return None
    rest = line[len("(let "):]
    name, _, term = rest.partition(" ")
    term = term[:-1]                       # the let's closing paren
    args = _top_level_args(term)
    ctor, operands = args[0], args[1:]
    return Let(name, ctor, tuple(a for a in operands if a.startswith("$")), tuple(operands))


def read_lets(lines: list[str]) -> list[Let]:
    return [let for let in map(read_let, lines) if let is not None]
