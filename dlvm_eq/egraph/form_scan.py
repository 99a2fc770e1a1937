"""A rule file's top-level forms and their direct children, found with array operations: the
depth of every character is one cumulative sum over the text with its strings and ; comments
blanked. (A Python loop over the parentheses took 19 ms a process over the shipped files.)

    scan = scan_forms('(rule ((Foo x)) ((Bar x)) :ruleset r)')
    scan.spans            # [(0, 38, 1, 1)]: start, end, line, column of each form
    scan.items(0)         # ['rule', 0, 1, ':ruleset', 'r']: atoms, and ints for child lists
    scan.child(0, 1)      # '((Bar x))', strings and comments blanked
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

import numpy as np

from ..sexpr import STRING

_BLANK = re.compile(STRING + r"|;[^\n]*", re.S)
_COMMENT = re.compile(r";[^\n]*")


@dataclass
class FormScan:
    """`code`: the text with strings and comments blanked (same length); `spans`: (start,
    end, line, column) of each top-level form, None where the text is not only forms,
    whitespace and comments; `children[i]`: (start, end) of form i's child lists."""

    code: str
    spans: list[tuple[int, int, int, int]] | None
    children: list[list[tuple[int, int]]] = field(default_factory=list)

    def items(self, i: int) -> list[str | int]:
        """Form i's elements in order: an atom as its text, a child list as its position in
        children[i] (a blanked string leaves no atom)."""
        start, end = self.spans[i][:2] if self.spans else (0, 0)
        parts, at = [], start + 1
        for s, e in self.children[i]:
            parts.append(self.code[at:s])
            at = e
        parts.append(self.code[at : end - 1])
        out: list[str | int] = []
        for k, part in enumerate(parts):
            out.extend(part.split())
            if k < len(parts) - 1:
                out.append(k)
        return out

    def child(self, i: int, k: int) -> str:
        s, e = self.children[i][k]
        return self.code[s:e]


_lock = threading.Lock()
_SCANS: dict[str, FormScan] = {}


def scan_forms(text: str) -> FormScan:
    """The forms of `text` (cached per text: the loader and the relevance analysis both read
    them)."""
    with _lock:
        hit = _SCANS.get(text)
    if hit is not None:
        return hit
    scan = _scan(text)
    with _lock:
        if len(_SCANS) > 64:  # user files edited many times in one process
            _SCANS.clear()
        _SCANS[text] = scan
    return scan


def _scan(text: str) -> FormScan:
    unclosed = False

    def blank(m: re.Match) -> str:
        nonlocal unclosed
        s = m.group()
        if s[0] == '"' and not m.group(1):
            unclosed = True
        return " " * len(s) if "\n" not in s else re.sub(r"[^\n]", " ", s)

    code = _BLANK.sub(blank, text)
    if unclosed or not text:
        return FormScan(code, None if unclosed else [])
    chars = np.frombuffer(code.encode("utf-32-le"), dtype=np.uint32)
    opens, closes = chars == 40, chars == 41
    depth = np.cumsum(opens.astype(np.int64) - closes)  # depth after each character
    if depth.min() < 0 or depth[-1] != 0:
        return FormScan(code, None)
    starts = np.flatnonzero(opens & (depth == 1)).tolist()
    ends = (np.flatnonzero(closes & (depth == 0)) + 1).tolist()
    gaps = zip([0] + ends, starts + [len(code)])
    if any(_COMMENT.sub("", text[e:s]).strip() for e, s in gaps):  # a stray atom or string
        return FormScan(code, None)
    newlines = np.flatnonzero(chars == 10)
    lines = np.searchsorted(newlines, starts).tolist()  # newlines before each start
    spans = []
    for s, e, n in zip(starts, ends, lines):
        bol = int(newlines[n - 1]) + 1 if n else 0
        spans.append((s, e, n + 1, s - bol + 1))
    kid_starts = np.flatnonzero(opens & (depth == 2))
    kid_ends = np.flatnonzero(closes & (depth == 1)) + 1
    owner = np.searchsorted(np.asarray(starts), kid_starts, side="right") - 1
    children: list[list[tuple[int, int]]] = [[] for _ in starts]
    for f, s, e in zip(owner.tolist(), kid_starts.tolist(), kid_ends.tolist()):
        children[f].append((s, e))
    return FormScan(code, spans, children)
