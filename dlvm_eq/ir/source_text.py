"""The text side of reading DLVM IR: where a node is (file:line:col errors with the line and a
caret), and readers for types, numbers and array literals. The parser (parser.py) and the
function-body reader (function_reader.py) share them.

    src = Source(text, "f.dl")
    raise src.at(token, "expected a tensor type")     # a SourceError naming f.dl:line:col
"""

from __future__ import annotations

import bisect
import difflib
import math
import re

import numpy as np
from lark import Token, Tree

from ..errors import SourceError
from .module import Const
from .types import DType, TensorType, TupleType, Type, size_problem

MAX_RANK = 32  # numpy's limit is 64; no real program comes near either
MAX_DIM = 2**31 - 1
DTYPES = {d.value: d for d in DType}
INT_TEXT = re.compile(r"[+-]?\d+$")


class Source:
    def __init__(self, text: str, filename: str, fast: dict | None = None):
        self.text, self.filename = text, filename
        self.lines = text.split("\n")  # lines as lark counts them
        self.fast = fast or {}  # line -> inst tree read by fastlines.scan
        self.fast_lines = sorted(self.fast)
        self.fast_used = 0

    def fast_between(self, first: int, last: int) -> list[int]:
        """The fast-path lines strictly between lines `first` and `last`."""
        keys = self.fast_lines
        return keys[bisect.bisect_right(keys, first) : bisect.bisect_left(keys, last)]

    def error(self, message: str, line: int, column: int) -> SourceError:
        line = max(1, min(line, len(self.lines)))
        # tabs shown as one space each keep the caret under the column
        source_line = self.lines[line - 1].rstrip("\r").replace("\t", " ")
        return SourceError(message, self.filename, line, column, source_line)

    def at(self, node, message: str) -> SourceError:
        return self.error(message, *position(node))

    def location(self, node) -> tuple[str, int, int]:
        return (self.filename, *position(node))

    def end(self) -> tuple[int, int]:
        return len(self.lines), len(self.lines[-1]) + 1


def position(node) -> tuple[int, int]:
    if isinstance(node, Token):
        return node.line or 1, node.column or 1
    if isinstance(node, Tree):
        if not node.meta.empty:
            return node.meta.line, node.meta.column
        for child in node.children:
            return position(child)
    return 1, 1


def token(node: Token | Tree) -> Token:
    """A parse-tree child that the grammar makes a token (a type checker sees Token | Tree)."""
    if not isinstance(node, Token):
        raise TypeError(f"the grammar gave a tree '{node.data}' where a token belongs")
    return node


def shorten(s: str, n: int = 24) -> str:
    return s if len(s) <= n else s[:n] + "..."


def suggest(name: object, choices) -> str:
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=3)
    if not close:
        return ""
    return "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"


# ---------------------------------------------------------------- types, numbers, literals


def read_type(src: Source, tree: Tree) -> Type:
    if tree.data == "scalar_type":
        return TensorType((), read_dtype(src, tree.children[0]))
    if tree.data == "tensor_type":
        *dims, dtype = tree.children
        if len(dims) > MAX_RANK:
            raise src.at(
                tree, f"tensors of rank {len(dims)} are not supported (at most {MAX_RANK})"
            )
        t = TensorType(tuple(read_dim(src, d) for d in dims), read_dtype(src, dtype))
        problem = size_problem(t.shape, t.dtype.itemsize)
        if problem:
            raise src.at(tree, f"{t}: {problem}")
        return t
    elements = [read_type(src, t) for t in tree.children]
    for node, element in zip(tree.children, elements):
        if isinstance(element, TupleType):
            raise src.at(node, "tuples cannot be nested")
    return TupleType(tuple(e for e in elements if isinstance(e, TensorType)))


def read_dtype(src: Source, node: Token | Tree) -> DType:
    tok = token(node)
    try:
        return DTYPES[str(tok)]
    except KeyError:
        raise src.at(tok, f"unknown data type '{tok}'; expected f32, f64, i32 or bool") from None


def read_int(src: Source, node: Token | Tree, what: str) -> int:
    tok = token(node)
    if not re.fullmatch(r"\d+", tok):
        raise src.at(tok, f"expected {what} (a non-negative integer), got '{shorten(tok)}'")
    value = int(tok)
    if value > MAX_DIM:
        raise src.at(tok, f"{what} {shorten(tok)} is too large")
    return value


def read_dim(src: Source, node: Token | Tree) -> int:
    return read_int(src, node, "a dimension")


def read_int_list(src: Source, tree: Tree, what: str) -> tuple[int, ...]:
    values = tuple(read_int(src, t, what) for t in tree.children)
    for i, v in enumerate(values):
        if v in values[:i]:
            raise src.at(tree.children[i], f"{what} {v} is listed twice")
    return values


def read_scalar(src: Source, tree: Tree, dtype: DType):
    """The value of a scalar literal token as a Python value of `dtype` (f32 values rounded)."""
    tok = token(tree.children[0])
    text = str(tok)
    if dtype is DType.bool:
        if tok.type not in ("TRUE", "FALSE"):
            raise src.at(tok, f"expected true or false for a bool literal, got '{shorten(text)}'")
        return tok.type == "TRUE"
    if tok.type in ("TRUE", "FALSE"):
        raise src.at(tok, f"'{text}' is a bool literal, but the type is {dtype}")
    if dtype is DType.i32:
        if not INT_TEXT.match(text):
            raise src.at(tok, f"expected an integer for an i32 literal, got '{shorten(text)}'")
        value = int(text)
        if not -(2**31) <= value < 2**31:
            raise src.at(tok, f"{shorten(text)} is out of range for i32")
        return value
    special = {"NAN": math.nan, "INF": math.inf, "NEG_INF": -math.inf}.get(tok.type)
    if special is None:
        special = float(text)
        with np.errstate(over="ignore"):
            overflow = math.isinf(np.asarray(special, dtype=dtype.numpy))
        if overflow:
            raise src.at(tok, f"{shorten(text)} is out of range for {dtype}")
    return Const.of(special, dtype).value


def read_array(src: Source, tree: Tree, dtype: DType) -> tuple[list, tuple[int, ...]]:
    """A `<...>` array literal: nested lists of values and the shape, checked rectangular."""
    values: list = []
    shapes: list[tuple[int, ...]] = []
    for elem in tree.children:
        inner, *annotation = elem.children
        if inner.data == "array":
            value, shape = read_array(src, inner, dtype)
        else:
            value, shape = read_scalar(src, inner, dtype), ()
        if annotation:
            t = read_type(src, annotation[0])
            if t != TensorType(shape, dtype):
                raise src.at(
                    annotation[0],
                    f"this element is a {TensorType(shape, dtype)} but is written as {t}",
                )
        if shapes and shape != shapes[0]:
            raise src.at(
                elem,
                f"array literal is ragged: element of shape {shape} after elements "
                f"of shape {shapes[0]}",
            )
        values.append(value)
        shapes.append(shape)
    shape = (len(values),) + shapes[0]
    if len(shape) > MAX_RANK:
        raise src.at(
            tree, f"array literal of rank {len(shape)} is not supported (at most {MAX_RANK})"
        )
    return values, shape


def read_functype(src: Source, tree: Tree) -> tuple[list[Type], Type]:
    *params, result = [read_type(src, t) for t in tree.children]
    for node, t in zip(tree.children, params):
        if isinstance(t, TupleType):
            raise src.at(node, f"a parameter cannot have tuple type {t}")
    return params, result
