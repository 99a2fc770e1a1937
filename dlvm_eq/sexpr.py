"""egglog's s-expressions, read in one place: the tokens, the parentheses that are code, and the
forms with their lines and source text. The rule verifier (verify/), `dlvm-eq query`'s
s-expression input (egraph/expr.py) and the rule-file checks (egraph/rule_text.py,
egraph/session.py, egraph/rule_origin.py, egraph/rule_program.py) all read egglog text here.

    read("(rewrite (Exp (Log x)) x) ; comment")
    # [SList([Sym('rewrite'), SList([Sym('Exp'), ...]), Sym('x')], line=1)]
    [(c, line, col) for c, _, line, col in parens('(a "(" ; (\\n b)')]
    # [('(', 1, 1), (')', 2, 3)]

Atoms: `Sym` (identifiers, operators, `:keywords`), `Str` ("text"), int, float (`1.0`, `inf`,
`-inf`, `NaN`). Lists are `SList` with the line, column and source text of the whole form.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

from .errors import DlvmError

# One regex pass (a character at a time in Python took 20 ms a process over the shipped rule
# files). A string is closed when group 1 is '"'; open, it runs to the end of the text.
STRING = r'"(?:[^"\\]|\\.)*("?)'
# every token: a string, a ; comment, a paren, an atom
TOKEN = re.compile(STRING + r'|;[^\n]*|[()]|[^\s()";]+', re.S)
# what decides the structure (no atoms: faster where only the parentheses matter)
STRUCTURE = re.compile(STRING + r"|;[^\n]*|[()]", re.S)


class Lines:
    """(line, column), both from 1, of text offsets; fastest for offsets in increasing order."""

    def __init__(self, text: str):
        self.text, self.at, self.line, self.bol = text, 0, 1, 0

    def __call__(self, i: int) -> tuple[int, int]:
        if i < self.at:  # an earlier offset: count again from the start
            self.at, self.line, self.bol = 0, 1, 0
        n = self.text.count("\n", self.at, i)
        if n:
            self.line += n
            self.bol = self.text.rfind("\n", self.at, i) + 1
        self.at = i
        return self.line, i - self.bol + 1


def parens(text: str) -> Iterator[tuple[str, int, int, int]]:
    """(char, index, line, column) of every '(' and ')' that is code, not inside a string or a
    ; comment: the scanner behind locating an unclosed paren and a file's top-level forms."""
    where = Lines(text)
    for m in STRUCTURE.finditer(text):
        c = m.group()
        if c in "()":
            yield (c, m.start(), *where(m.start()))


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
_ESCAPES = {"n": "\n", "t": "\t"}
_ESCAPE = re.compile(r"\\(.)", re.S)


def _atom(text: str):
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if text in _SPECIAL:
        return _SPECIAL[text]
    return Sym(text)


def read(text: str) -> list:
    """All top-level forms of `text` (iterative: forms nest as deep as the text does)."""
    out: list = []
    stack: list[tuple[list, int, int, int]] = []  # (items, line, col, start offset)
    where = Lines(text)
    for m in TOKEN.finditer(text):
        tok = m.group()
        c = tok[0]
        if c == ";":
            continue
        if c == "(":
            stack.append(([], *where(m.start()), m.start()))
            continue
        if c == ")":
            if not stack:
                raise SexprError("unbalanced ')'", *where(m.start()))
            items, line, col, start = stack.pop()
            x: object = SList(items, line, col, text[start : m.end()])
        elif c == '"':
            if not m.group(1):
                raise SexprError("unterminated string", *where(m.start()))
            x = Str(_ESCAPE.sub(lambda e: _ESCAPES.get(e.group(1), e.group(1)), tok[1:-1]))
        else:
            x = _atom(tok)
        (stack[-1][0] if stack else out).append(x)
    if stack:
        _, line, col, _ = stack[-1]
        raise SexprError("'(' is never closed", line, col)
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
