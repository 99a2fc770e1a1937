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

import threading

from .egglog_bindings import EGraph
from .exit_gate import in_egglog, owned
from .form_scan import scan_forms

_lock = threading.Lock()
# (file name, text) -> (the forms' spans, each form's egglog commands once parsed)
_PARSED: dict[tuple[str, str], tuple[list | None, list[tuple | None]]] = {}
_local = threading.local()  # a parser per thread (an EGraph belongs to its thread)


def top_level_spans(text: str) -> list[tuple[int, int, int, int]] | None:
    """(start, end, line, column) of each top-level form, or None where the text is not only
    forms, whitespace and ; comments (then only egglog can say what is wrong with it).

    >>> top_level_spans('(a)\\n ; c\\n (b (c ";)"))')
    [(0, 3, 1, 1), (10, 22, 3, 2)]
    >>> top_level_spans('(a) b') is None
    True
    """
    return scan_forms(text).spans


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


def parsed_program(text: str, filename: str, parser: EGraph | None = None) -> tuple:
    """egglog's commands of `text` (a rule file), parsed on the first call for this text and
    file name; egglog's EggSmolError propagates for a text that does not parse."""
    forms = parsed_forms(text, filename, None, parser)
    return tuple(c for form in forms for c in form)


def parsed_forms(text: str, filename: str, which, parser: EGraph | None = None) -> list[tuple]:
    """egglog's commands of the top-level forms numbered `which` (all for None), one tuple per
    form, each form parsed on its first use only (a session that compiles part of a file,
    egraph/rule_relevance.py, never parses the rest). A text that is not a sequence of forms
    is one form, parsed whole. parser: an EGraph of this thread to parse with (a session's:
    a thread's own parser would be dropped at the thread's end on the thread that joins it)."""
    key = (filename, text)
    with _lock:
        cached = _PARSED.get(key)
        if cached is None:
            if len(_PARSED) > 64:  # user files edited many times in one process
                _PARSED.clear()
            spans = top_level_spans(text)
            cached = _PARSED[key] = (spans, [None] * (1 if spans is None else len(spans)))
    spans, forms = cached
    wanted = range(len(forms)) if which is None or spans is None else which
    missing = [i for i in wanted if forms[i] is None]
    if missing:
        parser = parser if parser is not None else _parser()
        with in_egglog():  # the interpreter's exit waits for it (exit_gate.py)
            for i in missing:
                if spans is None:
                    forms[i] = tuple(parser.parse_program(text, filename=filename))
                else:
                    start, end, line, col = spans[i]
                    padded = "\n" * (line - 1) + " " * (col - 1) + text[start:end]
                    forms[i] = tuple(parser.parse_program(padded, filename=filename))
    return [forms[i] for i in wanted]
