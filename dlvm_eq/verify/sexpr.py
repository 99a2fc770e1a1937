"""A small reader for egglog's s-expressions, keeping lines and source text.

    read("(rewrite (Exp (Log x)) x) ; comment")
    # [SList([Sym('rewrite'), SList([Sym('Exp'), ...]), Sym('x')], line=1)]

Atoms: `Sym` (identifiers, operators, `:keywords`), `Str` ("text"), int, float (`1.0`, `inf`,
`-inf`, `NaN`). Lists are `SList` with the line, column and source text of the whole form.
"""

from __future__ import annotations

import math
import re

from ..errors import DlvmError


class Sym(str):
    """An identifier; `Sym("x") == "x"` but not a `Str`."""

    def __repr__(self) -> str:
        return f"Sym({str.__repr__(self)})"


class Str(str):
    """A string literal."""

    def __repr__(self) -> str:
        return f"Str({str.__repr__(self)})"


class SList(list):
    """A parenthesized form with its position and text."""

    def __init__(self, items, line: int, col: int, text: str = ""):
        super().__init__(items)
        self.line, self.col, self.text = line, col, text

    @property
    def head(self):
        return self[0] if self else None


class SexprError(DlvmError):
    def __init__(self, message: str, line: int, col: int):
        self.message, self.line, self.col = message, line, col
        super().__init__(f"{line}:{col}: {message}")


_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")
_SPECIAL = {"inf": math.inf, "-inf": -math.inf, "+inf": math.inf, "NaN": math.nan, "nan": math.nan}
_DELIM = set('() \t\r\n;"')


def _atom(text: str):
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if text in _SPECIAL:
        return _SPECIAL[text]
    return Sym(text)


def read(text: str) -> list:
    """All top-level forms of `text`."""
    out: list = []
    stack: list[tuple[list, int, int, int]] = []  # (items, line, col, start offset)
    i, line, col, n = 0, 1, 1, len(text)

    def emit(x):
        (stack[-1][0] if stack else out).append(x)

    while i < n:
        c = text[i]
        if c == "\n":
            i, line, col = i + 1, line + 1, 1
            continue
        if c in " \t\r":
            i, col = i + 1, col + 1
            continue
        if c == ";":
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "(":
            stack.append(([], line, col, i))
            i, col = i + 1, col + 1
            continue
        if c == ")":
            if not stack:
                raise SexprError("unbalanced ')'", line, col)
            items, l0, c0, start = stack.pop()
            emit(SList(items, l0, c0, text[start : i + 1]))
            i, col = i + 1, col + 1
            continue
        if c == '"':
            j, buf = i + 1, []
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    buf.append({"n": "\n", "t": "\t"}.get(text[j + 1], text[j + 1]))
                    j += 2
                    continue
                if text[j] == "\n":
                    line, col = line + 1, 0
                buf.append(text[j])
                j += 1
            if j >= n:
                raise SexprError("unterminated string", line, col)
            emit(Str("".join(buf)))
            col += j + 1 - i
            i = j + 1
            continue
        j = i
        while j < n and text[j] not in _DELIM:
            j += 1
        emit(_atom(text[i:j]))
        col += j - i
        i = j
    if stack:
        _, l0, c0, _ = stack[-1]
        raise SexprError("'(' is never closed", l0, c0)
    return out


def show(x) -> str:
    """Source-like text of a form."""
    if isinstance(x, SList):
        return "(" + " ".join(show(y) for y in x) + ")"
    if isinstance(x, Str):
        return '"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(x, float):
        if math.isnan(x):
            return "NaN"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return repr(x)
    return str(x)
