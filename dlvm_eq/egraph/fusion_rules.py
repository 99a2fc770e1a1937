"""rules/fusion.egg, generated from the op table: the scalar sub-language and the fusion rules.

    print(fusion_rules_text())      # what rules/fusion.egg holds (a test checks they agree)
    python -m dlvm_eq.egraph.fusion_rules > rules/fusion.egg      # after adding an op

One scalar constructor per elementwise op (`(SAdd Scalar Scalar)`, `(SExp Scalar)`, ...) and per
layout view (`(SBroadcast Scalar IVec)`: a scalar read at the view's index), named "S" + the
op's schema constructor, with the schema's argument sorts (Term -> Scalar). `(Load t)` reads
tensor t at the current index, `(Map s)` is the tensor whose every element is s, `(ReduceMap s
combinator init axes)` a reduction with its producer fused into its body.
"""

from __future__ import annotations

import re

from ..ir.ops import CAST, ELEMENTWISE_KINDS, LAYOUT, OPS
from .rulefiles import rule_file

HEADER = """\
;; rules/fusion.egg -- fusion as an extraction decision. GENERATED from the op table by
;; dlvm_eq/egraph/fusion_rules.py (python -m dlvm_eq.egraph.fusion_rules > rules/fusion.egg);
;; tests/test_fusion_rules.py checks that this file and the table agree.
;;
;; A scalar sub-language beside the tensor one: (Load t) reads tensor t at the current index,
;; (SAdd s s), (SExp s), ... compute one element, (Map s) is the tensor whose every element is s.
;; Every elementwise tensor op equals a Map of its scalar op over Loads of its operands, and
;; loading a Map is its scalar expression: the e-graph holds every fusion choice at once (a
;; value kept in a buffer and read, or recomputed in each kernel that reads it). Layout views
;; are index maps: a read through a view is the operand's scalar read at the view's index.
;; Extraction (dlvm_eq/extract/fusion_cost.py) decides, counting a materialized tensor once.
;; Needs rules/schema.egg (Term, IVec) loaded first.
"""


def schema_declarations() -> str:
    """rules/schema.egg's sorts and `(datatype Term ...)`, without its analyses: what the
    fusion e-graph needs (compiling the analysis rules would cost more than fusing)."""
    text = re.sub(r";[^\n]*", "", rule_file("schema.egg").read_text())
    start = text.index("(datatype Term")
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            break
    return text[: i + 1]


def schema_signatures() -> dict[str, tuple[str, ...]]:
    """Constructor -> argument sorts, from rules/schema.egg's `(datatype Term ...)` block."""
    text = schema_declarations()
    body = text[text.index("(datatype Term") + len("(datatype Term") : -1]
    return {m.group(1): tuple(m.group(2).split()) for m in re.finditer(r"\((\w+)([^()]*)\)", body)}


def scalar_ops() -> list[tuple[str, str, tuple[str, ...]]]:
    """(IR op, scalar constructor, argument sorts) per elementwise op, cast and layout view."""
    sigs = schema_signatures()
    out = []
    for name, spec in OPS.items():
        fusible = spec.kind in ELEMENTWISE_KINDS or spec.kind == CAST
        view = spec.kind == LAYOUT and spec.arity == 1
        if fusible or view:
            sorts = tuple("Scalar" if s == "Term" else s for s in sigs[spec.egg])
            out.append((name, "S" + spec.egg, sorts))
    return out


def fusion_rules_text() -> str:
    ops = scalar_ops()
    lines = [HEADER]
    lines.append("(datatype Scalar")
    lines.append("  (Load Term)                  ; tensor t read at the current index")
    for name, ctor, sorts in ops:
        kind = "view" if OPS[name].kind == LAYOUT else OPS[name].kind
        lines.append(f"  ({ctor} {' '.join(sorts)})".ljust(40) + f" ; {name} ({kind})")
    lines[-1] = lines[-1].rstrip()
    lines.append(")")
    lines.append("(constructor Map (Scalar) Term)                       ; every element is s")
    lines.append("(constructor ReduceMap (Scalar String f64 IVec) Term)  ; s reduced along axes")
    lines.append("")
    lines.append("(ruleset fusion)")
    lines.append(";; elementwise ops are maps of their scalar op")
    for name, ctor, sorts in ops:
        if OPS[name].kind == LAYOUT:
            continue
        args = [f"x{i}" if s == "Scalar" else f"p{i}" for i, s in enumerate(sorts)]
        lhs = f"({OPS[name].egg} {' '.join(args)})"
        rhs = f"(Map ({ctor} " + " ".join(f"(Load {a})" if a[0] == "x" else a for a in args) + "))"
        lines.append(f"(rewrite {lhs} {rhs} :ruleset fusion)")
    lines.append(
        ";; reading a map is its scalar expression (the value recomputed where it is read)"
    )
    lines.append("(rewrite (Load (Map s)) s :ruleset fusion)")
    lines.append(";; reading a layout view is reading its operand at the view's index")
    for name, ctor, sorts in ops:
        if OPS[name].kind != LAYOUT:
            continue
        args = ["t"] + [f"p{i}" for i in range(1, len(sorts))]
        lines.append(
            f"(rewrite (Load ({OPS[name].egg} {' '.join(args)})) "
            f"({ctor} (Load t) {' '.join(args[1:])}) :ruleset fusion)"
        )
    lines.append(";; a reduction reads its producer fused into its body")
    lines.append("(rewrite (Reduce x c i k) (ReduceMap (Load x) c i (vec-of k)) :ruleset fusion)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(fusion_rules_text(), end="")
