"""Parser fuzz: random text and mutated examples never raise anything but DlvmError; whatever
parses, verifies, and prints to text that parses back to the same text."""

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.errors import DlvmError, SourceError
from dlvm_eq.ir import verify

EXAMPLES = [p.read_text() for p in sorted((Path(__file__).parent.parent / "examples").glob("*.dl"))]
# pieces of the language, so that mutations make near-misses rather than only noise
TOKENS = [
    "%x",
    "%0",
    "@f",
    "'entry",
    "'b",
    ":",
    ",",
    "(",
    ")",
    "<",
    ">",
    "{",
    "}",
    "[",
    "]",
    "=",
    "->",
    " x ",
    "f32",
    "f64",
    "i32",
    "bool",
    "1",
    "0",
    "-1.5e3",
    "nan",
    "-inf",
    "true",
    "along",
    "by",
    "init",
    "to",
    "at",
    "from",
    "scalar",
    "func",
    "return",
    "branch",
    "conditional",
    "literal",
    "reduce",
    "apply",
    "extract",
    "add",
    "dot",
    "exp",
    "select",
    "shapeCast",
    "transpose",
    "[adjoint @f wrt 0]",
    "\n",
    " ",
    "//",
    '"',
    "module",
    "stage",
    "\t",
    "\x00",
    "é",
]


def check(text: str) -> None:
    try:
        m = dq.parse(text, "fuzz.dl")
    except SourceError as e:
        assert e.line is not None and e.line >= 1 and e.column >= 1
        str(e)
        return
    except DlvmError:
        return
    try:
        verify(m)
    except DlvmError:
        return
    printed = str(m)
    assert str(dq.parse(printed)) == printed


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(EXAMPLES))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 12)))
        how = draw(st.sampled_from(["delete", "insert", "replace", "duplicate"]))
        if how == "delete":
            text = text[:i] + text[j:]
        elif how == "insert":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        elif how == "replace":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[j:]
        else:
            text = text[:j] + text[i:j] + text[j:]
    return text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_random_bytes(data):
    check(data.decode("latin-1"))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(TOKENS), max_size=40).map("".join))
def test_random_token_soup(text):
    check(text)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_examples(text):
    check(text)


def test_deep_nesting_is_an_error_not_a_crash():
    text = (
        "func @f: () -> f32 {\n'entry():\n  %0 = literal "
        + "<" * 5000
        + "1"
        + ">" * 5000
        + ": f32\n"
    )
    check(text)
    check("func @f: () -> f32 {\n'entry():\n  %0 = literal 1: <" + "1 x " * 100 + "f32>\n")
    check("func @f: () -> f32 {\n'entry():\n  %0 = literal 1: <99999999999999999999 x f32>\n")
