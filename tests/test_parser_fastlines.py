"""The parser's fast path (ir/fastlines.py) reads exactly what lark reads: the same module, the
same locations, and on a mistake the same error."""

from pathlib import Path

import pytest

from dlvm_eq.errors import SourceError
from dlvm_eq.ir import fastlines
from dlvm_eq.ir.parser import _parse, parse
from dlvm_eq.ir.printer import print_module

ROOT = Path(__file__).resolve().parent.parent
T = "<2 x 3 x f32>"


def _lark_only(text: str, filename: str = "t.dl"):
    return _parse(text, filename, text, {})


def _program(*body: str, result: str = "%r") -> str:
    return "\n".join(
        [
            f"func @f: ({T}, {T}) -> {T} {{",
            f"'entry(%x: {T}, %y: {T}):",
            *body,
            f"    return {result}: {T}",
            "}",
            "",
        ]
    )


def _same(text: str):
    fast, slow = parse(text, "t.dl"), _lark_only(text)
    assert print_module(fast) == print_module(slow)
    for name, fn in slow.functions.items():
        assert [i.location for i in fast[name].body] == [i.location for i in fn.body]
    return fast


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.dl")), ids=lambda p: p.name)
def test_examples_parse_the_same(path):
    _same(path.read_text())


def test_generic_lines_are_taken_and_keywords_left_to_lark():
    text = _program(
        f"    %a = add %x: {T}, %y: {T}   // a comment",
        f"%b=multiply %a:{T},0.5:f32",
        f"    %s = reduce %b: {T} by add init 0: f32 along 1",
        "    %c = tanh %b: <2x3xf32>",
        f"    %r = subtract %c: {T}, -inf: f32",
    )
    _, fast = fastlines.scan(text)
    assert sorted(fast) == [3, 4, 6, 7]  # not the reduce (its own syntax)
    m = _same(text)
    assert [i.op for i in m["f"].body] == ["add", "multiply", "reduce", "tanh", "subtract"]
    assert m["f"].body[1].location == ("t.dl", 4, 1)


def test_instructions_keep_their_order_around_lark_lines():
    text = _program(
        f"    %t = transpose %x: {T.replace('2 x 3', '2 x 3')} along 0, 1",
        f"    %a = add %t: {T}, %y: {T}",
        "    %b = broadcast 1: f32 to 2 x 3",
        f"    %r = add %a: {T}, %b: {T}",
    )
    m = _same(text)
    assert [i.op for i in m["f"].body] == ["transpose", "add", "broadcast", "add"]


def test_a_tensor_literal_operand_names_its_literal_as_lark_does():
    text = _program(f"    %lit0 = add %x: {T}, %y: {T}", f"    %r = add %lit0: {T}, 2: {T}")
    _same(text)


@pytest.mark.parametrize(
    "body",
    [
        [f"    %r = add %x: {T}, %z: {T}"],  # not defined
        [f"    %r = add %r2: {T}, %y: {T}", f"    %r2 = exp %x: {T}"],  # used before defined
        [f"    %r = add %x: <2 x 4 x f32>, %y: {T}"],  # written with another type
        [f"    %r = add %x: {T}, %y: <2 x 3 x f16>"],  # unknown dtype
        [f"    %r = add %x: {T}"],  # arity
        [f"    %r = exp %x: {T}", f"    , %y: {T}"],  # a continuation line
        [f"    %r = add %x: {T}, 1e99: f32"],  # out of range
        [f"    %r = add %x: {T}, %y: {T}", f"    %r = exp %x: {T}"],  # defined twice
        [f"    %r = addd %x: {T}, %y: {T}"],  # unknown op (lark's line)
    ],
)
def test_errors_are_the_ones_lark_alone_gives(body):
    text = _program(*body)
    with pytest.raises(SourceError) as slow:
        _lark_only(text)
    with pytest.raises(SourceError) as fast:
        parse(text, "t.dl")
    assert str(fast.value) == str(slow.value)


def test_a_fast_line_outside_any_function_is_the_syntax_error_lark_gives():
    text = f"%a = add %x: {T}, %y: {T}\n" + _program(f"    %r = add %x: {T}, %y: {T}")
    with pytest.raises(SourceError) as slow:
        _lark_only(text)
    with pytest.raises(SourceError) as fast:
        parse(text, "t.dl")
    assert str(fast.value) == str(slow.value) and ":1:" in str(fast.value)
