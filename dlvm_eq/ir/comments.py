"""Comments kept through formatting: `dlvm-eq fmt` prints the module and puts every `//`
comment of the source back next to the code it was written beside.

The grammar ignores comments, so they are read from the source text here and re-attached by
source line: a comment on a line of its own goes before the first printed line that comes from
a later source line (indented like it); a comment after code on the same line stays at the end
of the printed line that comes from that source line. Printed lines know their source line
from the IR's locations (functions and instructions) and, for the module header and `return`,
from the source text.

    >>> text = format_with_comments(parse(src, "f.dl"), src)   # parse(text) == parse(src)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .module import Module
from .printer import module_lines


@dataclass(frozen=True)
class Comment:
    line: int  # 1-based source line
    text: str  # from `//` to the end of the line, trailing blanks removed
    own_line: bool  # nothing but blanks before it on its line


def split_comment(line: str) -> tuple[str, str | None]:
    """(code, comment or None) for one source line; `//` inside a "string" is not a comment."""
    in_string = False
    for i, ch in enumerate(line):
        if ch == '"':
            in_string = not in_string
        elif ch == "/" and not in_string and line.startswith("//", i):
            return line[:i], line[i:].rstrip()
    return line, None


def scan(text: str) -> tuple[list[Comment], list[str]]:
    """The comments of a source text, and its lines with the comments removed."""
    comments, code_lines = [], []
    for n, line in enumerate(text.split("\n"), start=1):
        code, comment = split_comment(line.rstrip("\r"))
        code_lines.append(code)
        if comment is not None:
            comments.append(Comment(n, comment, not code.strip()))
    return comments, code_lines


def _first_line(code_lines: list[str], pattern: str, start: int = 1) -> int | None:
    rx = re.compile(pattern)
    for n in range(max(start, 1), len(code_lines) + 1):
        if rx.match(code_lines[n - 1]):
            return n
    return None


def anchored_lines(m: Module, code_lines: list[str]) -> list[tuple[int | None, str]]:
    """`printer.module_lines` with the source line each printed line comes from (None: none)."""
    out: list[tuple[int | None, str]] = []
    last = 0  # the latest source line of the current function
    for kind, obj, text in module_lines(m):
        at = getattr(obj, "location", None)  # funcs, adjoints and instructions have one
        line = None
        if kind in ("module", "stage"):
            line = _first_line(code_lines, rf"\s*{kind}\b")
        elif kind == "func" and at:
            line = last = at[1]
        elif kind == "adjoint" and at:  # written on or before the func line
            line = next(
                (n for n in range(at[1], 0, -1) if code_lines[n - 1].lstrip().startswith("[")),
                None,
            )
        elif kind == "inst" and at:
            line = at[1]
            last = max(last, line)
        elif kind == "return" and last:
            line = _first_line(code_lines, r"\s*return\b", last)
        out.append((line, text))
    return out


def format_with_comments(m: Module, source: str) -> str:
    """The module printed as `print_module` does, with the source's comments put back."""
    comments, code_lines = scan(source)
    lines = anchored_lines(m, code_lines)
    trailing: dict[int, list[str]] = {}
    pending = []
    for c in comments:
        if not c.own_line and any(a == c.line for a, _ in lines):
            trailing.setdefault(c.line, []).append(c.text)
        else:
            pending.append(c)
    out: list[str] = []
    used_trailing: set[int] = set()
    for anchor, text in lines:
        if anchor is not None:
            indent = text[: len(text) - len(text.lstrip())]
            while pending and pending[0].line < anchor:
                out.append(indent + pending.pop(0).text)
            if anchor in trailing and anchor not in used_trailing:
                used_trailing.add(anchor)
                text = text + "  " + "  ".join(trailing[anchor])
        out.append(text)
    if pending and out and out[-1] != "":
        out.append("")
    out.extend(c.text for c in pending)
    return "\n".join(out) + "\n"
