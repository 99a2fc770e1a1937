"""Reading the control-flow ops of `.dl` text (grammar.lark's scan_op, while_op, cond_op,
switch_op) into (op, operands, attributes), for the parser's function reader:

    %r = scan @step carry (%h: <4 x f32>) over (%xs: <8 x 3 x f32>) length 8 reverse

Bodies are looked up in the module (every signature is read before any body); a mismatch
between a body's signature and the operands is a located error naming the value.
"""

from __future__ import annotations

from lark import Token, Tree

from ..errors import IRError
from .control_flow import COND, SCAN, SWITCH, WHILE, check


def _body(reader, tok: Token | Tree):
    name = str(tok)[1:]
    fn = reader.module.functions.get(name)
    if fn is None:
        known = ", ".join("@" + n for n in reader.module.functions)
        raise reader.src.at(tok, f"no function @{name} to run (functions: {known})")
    return fn


def _checked(reader, tree: Tree, op: str, operands, attrs: dict):
    labels = [f"%{o.name}" if hasattr(o, "name") else f"constant {o.value}" for o in operands]
    try:
        check(op, [o.type for o in operands], attrs, labels)
    except IRError as e:
        raise reader.src.at(tree, str(e)) from None
    return op, operands, attrs


def _groups(reader, children) -> dict[str, list]:
    out: dict[str, list] = {"cf_carry": [], "cf_over": [], "cf_with": []}
    for child in children:
        if isinstance(child, Tree) and child.data in out:
            out[child.data] = reader.operands(child.children[0])
    return out


def read_scan(reader, tree: Tree):
    body_tok = tree.children[0]
    g = _groups(reader, tree.children[1:])
    length_tok = next(c for c in tree.children[1:] if isinstance(c, Token) and c.type != "REVERSE")
    from .source_text import read_int  # (function_reader.py imports this module)

    attrs = {
        "body": _body(reader, body_tok),
        "length": read_int(reader.src, length_tok, "a length"),
        "reverse": any(isinstance(c, Token) and c.type == "REVERSE" for c in tree.children),
        "carries": len(g["cf_carry"]),
        "xs": len(g["cf_over"]),
    }
    return _checked(reader, tree, SCAN, g["cf_carry"] + g["cf_over"] + g["cf_with"], attrs)


def read_while(reader, tree: Tree):
    cond_tok, body_tok, *rest = tree.children
    g = _groups(reader, rest)
    attrs = {
        "cond": _body(reader, cond_tok),
        "body": _body(reader, body_tok),
        "carries": len(g["cf_carry"]),
    }
    return _checked(reader, tree, WHILE, g["cf_carry"] + g["cf_with"], attrs)


def read_cond(reader, tree: Tree):
    pred, yes, no, *rest = tree.children
    args = reader.operands(rest[0]) if rest else []
    attrs = {"branches": (_body(reader, yes), _body(reader, no))}
    return _checked(reader, tree, COND, [reader.operand(pred), *args], attrs)


def read_switch(reader, tree: Tree):
    index, *rest = tree.children
    names = [c for c in rest if isinstance(c, Token) and c.type == "GLOBAL"]
    args = [c for c in rest if isinstance(c, Tree) and c.data == "operands"]
    attrs = {"branches": tuple(_body(reader, t) for t in names)}
    ops = [reader.operand(index), *(reader.operands(args[0]) if args else [])]
    return _checked(reader, tree, SWITCH, ops, attrs)


SYNTAX = {
    "scan_op": read_scan,
    "while_op": read_while,
    "cond_op": read_cond,
    "switch_op": read_switch,
}
