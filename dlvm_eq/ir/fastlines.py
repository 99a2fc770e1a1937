"""The parser's fast path: whole lines of the generic instruction form, read without lark.

    %v3 = add %v2: <4 x 8 x f32>, 0.5: f32     // a comment

Such a line (one instruction, generic syntax, an op of the op table without attributes, no
tuple types) is matched by one regular expression and turned into the very subtree lark would
build (`inst` -> `generic` -> `operands`), with its tokens' lines and columns, so the parser's
reader checks it exactly as any other instruction. Lark then parses the text with those lines
blanked (line numbers unchanged): long straight-line programs parse in linear time at a few
microseconds per instruction instead of lark's ~0.4 ms. Anything unusual stays with lark; the
parser falls back to lark alone whenever the fast path meets an error, so every error message
is the one lark's path gives.

    text, insts = scan(source)     # insts: line number -> Tree("inst", ...)
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from pathlib import Path

from lark import Token, Tree

from .ops import OPS

_WS = r"[ \t\f\r]*"
_VALUE = r"%[A-Za-z0-9_.]+"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_SCALAR = r"(?:[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![A-Za-z0-9_.])|true\b|false\b|nan\b|\+?inf\b|-inf\b)"
_TYPE = rf"(?:<(?:{_WS}\d+{_WS}x)*{_WS}{_NAME}{_WS}>|{_NAME})"
_OPERAND = rf"({_VALUE}|{_SCALAR}){_WS}:{_WS}({_TYPE})"
_LINE = re.compile(
    rf"^({_WS})({_VALUE}){_WS}={_WS}({_NAME}){_WS}"
    rf"((?:{_OPERAND}{_WS},{_WS})*{_OPERAND}){_WS}(?://[^\n]*)?$"
)
_ONE_OPERAND = re.compile(rf"{_WS}{_OPERAND}{_WS},?")
_DIMS = re.compile(r"\d+")
_TENSOR = re.compile(rf"<((?:{_WS}\d+{_WS}x)*){_WS}({_NAME}){_WS}>")

_SCALAR_TYPES = {
    "true": "TRUE",
    "false": "FALSE",
    "nan": "NAN",
    "inf": "INF",
    "+inf": "INF",
    "-inf": "NEG_INF",
}


@lru_cache(maxsize=1)
def _keywords() -> frozenset:
    """Words the grammar spells itself (`reduce`, `literal`, ...): those lines stay with lark."""
    grammar = Path(__file__).with_name("grammar.lark").read_text()
    return frozenset(re.findall(r'"([A-Za-z]+)"', grammar)) | {
        "return",
        "branch",
        "conditional",
        "func",
    }


@cache
def _fast_op(name: str) -> bool:
    spec = OPS.get(name)
    return spec is not None and not spec.attrs and name not in _keywords()


@lru_cache(maxsize=256)
def _type_tree(text: str) -> Tree:
    # shared by every operand written with this type: only error messages read its tokens'
    # positions, and on an error the parser reads the file again with lark
    m = _TENSOR.fullmatch(text)
    if m is not None:
        kids: list[Token | Tree] = [Token("NUMBER", d) for d in _DIMS.findall(m.group(1))]
        return Tree("tensor_type", kids + [Token("NAME", m.group(2))])
    return Tree("scalar_type", [Token("NAME", text)])


def _line_tree(m: re.Match, line_no: int) -> Tree | None:
    indent, result, op, operands_text = m.group(1), m.group(2), m.group(3), m.group(4)
    if not _fast_op(op):
        return None
    operands: list[Token | Tree] = []
    start = m.start(4) + 1
    for om in _ONE_OPERAND.finditer(operands_text):
        first, t = om.group(1), _type_tree(om.group(2))
        if first[0] == "%":
            operands.append(Tree("value_operand", [Token("VALUE", first), t]))
        else:  # positioned: a tensor-typed constant becomes a literal located here
            tok = Token(
                _SCALAR_TYPES.get(first, "NUMBER"), first, line=line_no, column=start + om.start(1)
            )
            operands.append(Tree("const_operand", [Tree("scalar", [tok]), t]))
    generic = Tree("generic", [Token("NAME", op), Tree("operands", operands)])
    # the result token carries the instruction's position (its location and `defined at`)
    return Tree("inst", [Token("VALUE", result, line=line_no, column=len(indent) + 1), generic])


def scan(text: str) -> tuple[str, dict[int, Tree]]:
    """(text with the fast lines blanked, line number -> the `inst` tree of that line)."""
    lines = text.split("\n")
    insts: dict[int, Tree] = {}
    for i, line in enumerate(lines):
        if "=" not in line or "%" not in line:
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        tree = _line_tree(m, i + 1)
        if tree is not None:
            insts[i + 1] = tree
            lines[i] = ""
    return ("\n".join(lines) if insts else text), insts


def names(tree: Tree) -> tuple[str, list[str]]:
    """(the %name an `inst` tree defines, the %names it reads), without the '%'."""
    result, generic = tree.children
    reads = [
        str(o.children[0])[1:] for o in generic.children[1].children if o.data == "value_operand"
    ]
    return str(result)[1:], reads
