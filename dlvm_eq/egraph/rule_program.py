"""Rule files as parsed egglog commands, parsed once per process and run into each thread's
sessions (egglog's parsed commands are plain data; only its EGraph belongs to one thread).

    commands = parsed_program(text, "rules/algebra.egg")   # cached by (text, file name)
    egraph.run_program(*commands)

egglog's parser takes time that grows with the length of the text a command came in (its
spans carry the text): algebra.egg (550 lines) took 0.4-1.0 s in one text and 15 ms as one
text per top-level form. Each form is parsed alone, padded with the newlines and spaces that
precede it, so that egglog's "In L:C of FILE" locations and its names for unnamed rules (their
text) are those of the whole file. Text that is not a sequence of forms (an unclosed paren, a
stray atom) is parsed whole, so that egglog reports the mistake as it would.
"""

from __future__ import annotations

import re
import threading

from ..sexpr import STRUCTURE
from .egglog_bindings import EGraph
from .exit_gate import in_egglog, owned

_COMMENT = re.compile(r";[^\n]*")
_lock = threading.Lock()
_PARSED: dict[tuple[str, str], tuple] = {}  # (file name, text) -> egglog commands
_local = threading.local()  # a parser per thread (an EGraph belongs to its thread)


def top_level_spans(text: str) -> list[tuple[int, int, int, int]] | None:
    """(start, end, line, column) of each top-level form, or None where the text is not only
    forms, whitespace and ; comments (then only egglog can say what is wrong with it).

    >>> top_level_spans('(a)\\n ; c\\n (b (c ";)"))')
    [(0, 3, 1, 1), (10, 22, 3, 2)]
    >>> top_level_spans('(a) b') is None
    True
    """
    spans, depth, start = [], 0, 0
    for m in STRUCTURE.finditer(text):
        c = m.group()
        if c == "(":
            if depth == 0:
                start = m.start()
            depth += 1
        elif c == ")":
            if depth == 0:
                return None  # a ')' closing nothing
            depth -= 1
            if depth == 0:
                spans.append((start, m.end()))
        elif c[0] == '"' and not m.group(1):
            return None  # a string never closed
    if depth:
        return None
    ends = [0] + [e for _, e in spans]
    starts = [s for s, _ in spans] + [len(text)]
    for e, s in zip(ends, starts):
        if _COMMENT.sub("", text[e:s]).strip():
            return None
    out, line, at = [], 1, 0
    for s, e in spans:
        line += text.count("\n", at, s)
        at = s
        out.append((s, e, line, s - text.rfind("\n", 0, s)))
    return out


class _Parser:
    """This thread's egglog EGraph used for parsing only (exit_gate.owned: never dropped on
    another thread at interpreter exit)."""

    def __init__(self):
        self.thread = threading.get_ident()
        self.egraph = EGraph()
        owned(self)


def _parser() -> EGraph:
    p = getattr(_local, "parser", None)
    if p is None:
        p = _local.parser = _Parser()
    return p.egraph


def parsed_program(text: str, filename: str) -> tuple:
    """egglog's commands of `text` (a rule file), parsed on the first call for this text and
    file name; egglog's EggSmolError propagates for a text that does not parse."""
    key = (filename, text)
    with _lock:
        hit = _PARSED.get(key)
    if hit is not None:
        return hit
    parser = _parser()
    spans = top_level_spans(text)
    with in_egglog():  # the interpreter's exit waits for it (exit_gate.py)
        if spans is None:
            commands = tuple(parser.parse_program(text, filename=filename))
        else:
            commands = tuple(
                c
                for start, end, line, col in spans
                for c in parser.parse_program(
                    "\n" * (line - 1) + " " * (col - 1) + text[start:end], filename=filename
                )
            )
    with _lock:
        if len(_PARSED) > 64:  # user files edited many times in one process
            _PARSED.clear()
        _PARSED[key] = commands
    return commands
