"""The IR reference page, generated from the op table (`dlvm_eq.ir.ops.OPS`) and
rules/adjoint.egg, so that it cannot go stale.

    markdown = ir_reference_page(Path("rules/adjoint.egg"))

For every op: its `.dl` spelling (an example instruction printed by the IR printer), its type
rule (the kind's rule in words, and the example's operand and result types computed by the op's
own `result_type`), its e-graph constructor and its adjoint (the rules of adjoint.egg whose
left side is that constructor, one line per operand). An op added to the table appears here on
the next build; one without an example below still gets a row from its table entry.
"""

from __future__ import annotations

import re
from pathlib import Path

from rule_language import split_forms

from dlvm_eq.ir.module import Instruction, Value
from dlvm_eq.ir.ops import BIT_OPS, OPS
from dlvm_eq.ir.printer import format_instruction
from dlvm_eq.ir.types import BOOL, DType, TensorType, TupleType

F32 = DType.f32


def t(*shape, dtype=F32) -> TensorType:
    return TensorType(tuple(shape), dtype)


I32 = DType.i32
CONV = {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1}
POOL = {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0, 0, 0)}

# op -> (operand types, attributes) of one example instruction; elementwise ops need none
EXAMPLES: dict[str, tuple[list, dict]] = {
    "select": ([t(2, 3), t(2, 3), t(2, 3, dtype=BOOL)], {}),
    "dot": ([t(2, 3), t(3, 4)], {}),
    "transpose": ([t(2, 3, 4)], {"perm": (0, 2, 1)}),
    "reduce": ([t(2, 3)], {"combinator": "add", "init": 0.0, "axes": (1,)}),
    "shapeCast": ([t(2, 3)], {"shape": (3, 2)}),
    "padShape": ([t(2, 3)], {"at": 0}),
    "squeezeShape": ([t(1, 3)], {"at": 0}),
    "broadcast": ([t(3)], {"shape": (2, 3)}),
    "dataTypeCast": ([t(2, 3)], {"dtype": DType.f64}),
    "concatenate": ([t(2, 3), t(4, 3)], {"axis": 0}),
    "slice": ([t(4, 3)], {"axis": 0, "lo": 1, "hi": 3}),
    "literal": ([], {"value": 1.0, "type": t(2, 3)}),
    "tuple": ([t(2), t(3)], {}),
    "extract": ([TupleType((t(2), t(3)))], {"index": 1}),
    "apply": ([t(2, 3)], {"callee": "g", "type": t(2)}),
    "conv2d": ([t(1, 2, 4, 4), t(3, 2, 3, 3)], CONV),
    "conv2dBackwardInput": ([t(1, 3, 4, 4), t(3, 2, 3, 3)], {**CONV, "size": (4, 4)}),
    "conv2dBackwardWeight": ([t(1, 2, 4, 4), t(1, 3, 4, 4)], {**CONV, "size": (3, 3)}),
    "maxPool2d": ([t(1, 2, 4, 4)], POOL),
    "maxPool2dBackward": ([t(1, 2, 4, 4), t(1, 2, 2, 2)], POOL),
    "maxPool2dGather": ([t(1, 2, 4, 4), t(1, 2, 4, 4)], POOL),
    "avgPool2d": ([t(1, 2, 4, 4)], POOL),
    "avgPool2dBackward": ([t(1, 2, 2, 2)], {**POOL, "size": (4, 4)}),
    "batchMatmul": ([t(5, 2, 3), t(5, 3, 4)], {}),
    "take": ([t(4, 3), t(2, dtype=I32)], {"axis": 0}),
    "scatterAdd": ([t(2, 3), t(2, dtype=I32)], {"axis": 0, "size": 4}),
    "cumsum": ([t(2, 3)], {"axis": 1, "reverse": False}),
    "sliceScatter": ([t(2, 3)], {"axis": 0, "lo": 0, "step": 2, "size": 4}),
    **{name: ([t(2, 3, dtype=I32), t(3, dtype=I32)], {}) for name in BIT_OPS},
}

KIND_RULES = {
    "unary": "one operand; the result has its shape and dtype",
    "binary": "operands of one dtype, shapes broadcast as in numpy; the result has the "
    "broadcast shape",
    "compare": "operands of one dtype, shapes broadcast as in numpy; a bool result of the "
    "broadcast shape",
    "logic": "bool operands, shapes broadcast as in numpy; a bool result",
    "select": "`a`, `b` of one dtype and a bool mask, all broadcast; the result has a's dtype",
}


def example(name: str) -> tuple[list, dict] | None:
    """The example operands and attributes of op `name`, built for elementwise ops."""
    spec = OPS[name]
    if name in EXAMPLES:
        return EXAMPLES[name]
    n = spec.arity or 2
    if spec.kind in ("unary", "binary", "compare"):
        shapes = [t(2, 3), t(3)][:n] if spec.kind != "unary" else [t(2, 3)]
        return shapes, {}
    if spec.kind == "logic":
        return [t(2, 3, dtype=BOOL)] * n, {}
    return None


def spelling(name: str) -> tuple[str, str] | None:
    """(instruction text, `operand types -> result type`) of op `name`'s example."""
    ex = example(name)
    if ex is None:
        return None
    types, attrs = ex
    operands = [Value(chr(ord("a") + k), ty) for k, ty in enumerate(types)]
    result = OPS[name].result_type(list(types), attrs)
    inst = Instruction(Value("r", result), name, operands, dict(attrs))
    signature = (", ".join(str(ty) for ty in types) or "no operands") + f" -> {result}"
    return format_instruction(inst), signature


def _children(form: str) -> list[str]:
    """The top-level items inside one s-expression's parentheses."""
    out, depth, start = [], 0, None
    for k, c in enumerate(form[1:-1], 1):
        if c == "(":
            if depth == 0:
                start = k
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                out.append(form[start : k + 1])
                start = None
        elif depth == 0 and not c.isspace() and start is None:
            start = k
        elif depth == 0 and c.isspace() and start is not None:
            out.append(form[start:k])
            start = None
    if start is not None:
        out.append(form[start:-1])
    return out


def adjoint_rules(path: Path) -> dict[str, list[tuple[int, str]]]:
    """constructor -> [(operand, right side or rule text)] from adjoint.egg."""
    out: dict[str, list[tuple[int, str]]] = {}
    for f in split_forms(path.read_text()):
        text = " ".join(f.text.split())
        m = re.search(r"\(Adjoint (\d+) \(([A-Z]\w*)", text)
        if not m or f.head not in ("rewrite", "rule"):
            continue
        parts = _children(text)
        if f.head == "rewrite":
            shown = f"`{parts[2]}`"
        else:  # (rule (query...) ((union adj RIGHT) ...)): the right side of the union
            unions = [_children(a) for a in _children(parts[2]) if a.startswith("(union ")]
            shown = f"`{unions[0][2]}`" if unions else f"rule at adjoint.egg:{f.line}"
        out.setdefault(m[2], []).append((int(m[1]), shown))
    return out


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def ir_reference_page(adjoint_egg: Path) -> str:
    adjoints = adjoint_rules(adjoint_egg)
    out = [
        "# IR reference",
        "",
        "*Generated from the op table (`dlvm_eq/ir/ops.py`, `OPS`) and `rules/adjoint.egg`",
        "when the site is built (`docs/gen/ir_reference.py`); every example below is printed",
        "by the IR printer and type-checked by the op's own type rule.*",
        "",
        "A `.dl` instruction is `%result = op operands attributes`; each operand is written with",
        "its type (`%x: <2 x 3 x f32>`; a scalar literal `2: f32`). Types are scalars",
        "`f32 f64 i32 bool`, tensors `<2 x 3 x f32>` and tuples `(T, T)` (results only).",
        "In the adjoint column, `g` is the adjoint of the op's result and `(Adjoint i u g)` the",
        "contribution to operand i (see [the rule language](rule-language.md)); `Like v x` is",
        "the constant v shaped like x.",
        "",
        "| op | kind | `.dl` spelling | type rule | constructor | adjoint |",
        "|---|---|---|---|---|---|",
    ]
    for name, spec in OPS.items():
        sp = spelling(name)
        if sp is None:
            text = f"`{name} ...`" + (
                f" (attributes: {', '.join(spec.attrs)})" if spec.attrs else ""
            )
            rule = KIND_RULES.get(spec.kind, "see the op's docstring")
        else:
            text = f"`{sp[0]}`"
            rule = KIND_RULES.get(spec.kind, "")
            rule = (rule + "; " if rule else "") + f"e.g. `{sp[1]}`"
        if spec.float_only:
            rule += " (float operands only)"
        adjoint = []
        if not spec.differentiable:
            adjoint.append("none (not differentiable)")
        for i, rhs in sorted(adjoints.get(spec.egg, []), key=lambda x: x[0]):
            adjoint.append(f"{i}: {rhs}")
        for i in spec.nondiff_operands:
            adjoint.append(f"{i}: none")
        doc = getattr(spec, "doc", "") or ""
        row = [
            f"`{name}`",
            spec.kind,
            _md(text) + (f" {doc}" if doc else ""),
            _md(rule),
            f"`{spec.egg}`",
            _md("<br>".join(adjoint) or "no rule"),
        ]
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"
