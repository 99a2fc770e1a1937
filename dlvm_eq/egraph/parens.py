"""The parentheses of egglog text, outside strings and `;` comments, with their positions: the
one scanner behind locating an unclosed paren (session.py) and the top-level forms of a rule
file (rule_origin.py).

    >>> [(c, line, col) for c, _, line, col in parens('(a "(" ; (\\n b)')]
    [('(', 1, 1), (')', 2, 3)]
"""

from __future__ import annotations

from collections.abc import Iterator


def parens(text: str) -> Iterator[tuple[str, int, int, int]]:
    """(char, index, line, column) of every '(' and ')' that is code (1-based line/column)."""
    line, col, i, n = 1, 0, 0, len(text)
    in_string = False
    while i < n:
        c = text[i]
        col += 1
        if c == "\n":
            line, col = line + 1, 0
        elif in_string:
            if c == "\\":
                i, col = i + 1, col + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == ";":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        elif c in "()":
            yield c, i, line, col
        i += 1
