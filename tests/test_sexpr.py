"""The one s-expression reader (dlvm_eq/sexpr.py, issue 35): forms read back from their printed
text, positions and source text checked against str.find and a character-at-a-time scanner
written here, and the errors located."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlvm_eq.sexpr import SexprError, SList, Str, Sym, parens, read, show

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?inf|nan|NaN")
_SYMS = st.from_regex(r"[A-Za-z:_+*/<>=!?.-][A-Za-z0-9_:+*/<>=!?.-]{0,6}", fullmatch=True).filter(
    lambda s: not _NUMBER.fullmatch(s)  # numbers read as numbers
)
_ATOMS = st.one_of(
    _SYMS.map(Sym),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=8).map(Str),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
)
_FORMS = st.recursive(_ATOMS, lambda inner: st.lists(inner, max_size=4), max_leaves=20)


def _plain(x):
    """A form as Python values, to compare (NaN as a marker, types kept)."""
    if isinstance(x, list):
        return ["list", [_plain(y) for y in x]]
    if isinstance(x, float) and math.isnan(x):
        return ["nan"]
    return [type(x).__name__, x]


def _as_slist(x):
    return SList([_as_slist(y) for y in x], 0, 0) if isinstance(x, list) else x


@given(st.lists(_FORMS, min_size=1, max_size=3))
def test_printed_forms_read_back_as_themselves(forms):
    forms = [_as_slist(f) for f in forms]
    text = "\n ; a comment ( \n".join(show(f) for f in forms)
    assert [_plain(f) for f in read(text)] == [_plain(f) for f in forms]


@given(st.lists(_FORMS.filter(lambda f: isinstance(f, list)), min_size=1, max_size=3))
def test_a_forms_line_column_and_text_are_where_it_is_written(forms):
    texts = [show(_as_slist(f)) for f in forms]
    text = "  " + "\n\n   ".join(texts)
    at = 0
    for form, written in zip(read(text), texts):
        start = text.find(written, at)
        line = text.count("\n", 0, start) + 1
        col = start - (text.rfind("\n", 0, start) + 1) + 1
        assert (form.line, form.col, form.text) == (line, col, written)
        at = start + len(written)


def _parens_by_hand(text: str):
    """The scanner sexpr.parens replaced: one character at a time."""
    out, line, col, i, in_string = [], 1, 0, 0, False
    while i < len(text):
        c = text[i]
        col += 1
        if c == "\n":
            line, col = line + 1, 0
        elif in_string:
            if c == "\\" and text[i + 1 : i + 2] != "\n":
                i, col = i + 1, col + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == ";":
            j = text.find("\n", i)
            i = len(text) if j < 0 else j
            continue
        elif c in "()":
            out.append((c, i, line, col))
        i += 1
    return out


@given(st.text(st.sampled_from('() \n;"\\ax1'), max_size=40))
def test_parens_are_the_code_parens_of_any_text(text):
    assert list(parens(text)) == _parens_by_hand(text)


@pytest.mark.parametrize(
    "text, message, line, col",
    [
        ("(a (b)\n c))", "unbalanced ')'", 2, 4),
        ('(a "b\n c)', "unterminated string", 1, 4),
        ("(a (b)\n (c", "'(' is never closed", 2, 2),
    ],
)
def test_errors_name_the_line_and_column(text, message, line, col):
    with pytest.raises(SexprError) as e:
        read(text)
    assert (e.value.message, e.value.line, e.value.col) == (message, line, col)


def test_deep_forms_read_without_recursion():
    depth = 3000  # past Python's recursion limit (each level keeps its text: quadratic memory)
    (form,) = read("(f " * depth + "x" + ")" * depth)
    for _ in range(depth - 1):
        form = form[1]
    assert list(form) == [Sym("f"), Sym("x")]
