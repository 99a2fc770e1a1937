"""The op registry (ir/registry/) against the declarative rule files, both ways: what each
side names that the other lacks, one line per gap (tests/test_registry.py asserts none).

    >>> registry_gaps()
    []

- registry -> schema.egg: every op in the e-graph has its constructor, with one Term argument
  per operand, then its attributes as OpSpec.egg_attrs lays them out, and a shape/dtype
  analysis rule.
- schema.egg -> registry: every constructor is an op's (or a leaf, or an op's other spelling).
- every rule file -> registry: every Term constructor a file declares is an op's or has an
  e-graph-only entry (ir/registry/egraph_only.py: Gemm, the adjoint helpers, ...); and each
  entry is declared in its file, with the Term arguments of its op's operands.
- registry -> adjoint.egg: every differentiable operand of every op has a rule.
- adjoint.egg -> registry: every rule is for an op's operand that is differentiable.
- the registry itself: what a layer above reads is there (kernel formula, cost class,
  batching rule, the meaning on sympy arrays of products, reductions, gathers, window ops
  and attention).
"""

from __future__ import annotations

import re

from ..ir.op_spec import (
    CALL,
    CONTROL,
    COST_FLOPS,
    DOT,
    EGG_SORTS,
    ELEMENTWISE_KINDS,
    GATHER,
    LITERAL,
    REDUCE,
    SELECT,
    TUPLE,
    WINDOW,
)
from ..ir.ops import OPS
from ..ir.registry.attention import ATTENTION
from ..ir.registry.egraph_only import EGRAPH_ONLY, IR_FORM
from .rulefiles import SHIPPED, rule_file
from .serialized import LEAVES

# ops the loader removes before the e-graph: literals become Const/Lit, tuples become several
# roots, extract picks one, apply is inlined; control flow stays outside it (its bodies go in)
NOT_IN_EGRAPH = (LITERAL, TUPLE, CALL, CONTROL)
# an op's other spelling in the schema: StridedSlice, the IR's slice with a step > 1
SCHEMA_ONLY = {e: s.op for e, s in EGRAPH_ONLY.items() if s.role == IR_FORM and s.op}
EGG_ARITY = {"Concatenate": 2}  # variadic in the IR, binary in the e-graph
# kinds whose meaning verify reads from the registry (OpSpec.symbolic), not from a formula
SYMBOLIC_KINDS = (DOT, REDUCE, GATHER, WINDOW, ATTENTION)


def _strip_comments(text: str) -> str:
    return re.sub(r";[^\n]*", "", text)


def schema_constructors(text: str) -> dict[str, tuple[str, ...]]:
    """Constructor -> argument sorts, from a schema's `(datatype Term ...)` block."""
    text = _strip_comments(text)
    start = text.index("(datatype Term")
    depth, end = 0, start
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            end = i
            break
    body = text[start + len("(datatype Term") : end]
    return {m.group(1): tuple(m.group(2).split()) for m in re.finditer(r"\((\w+)([^()]*)\)", body)}


def adjoint_heads(text: str) -> set[tuple[int, str]]:
    """(operand, constructor) of every `(Adjoint i (Ctor ...) g)` rule."""
    return {(int(i), c) for i, c in re.findall(r"\(Adjoint (\d+) \((\w+)", _strip_comments(text))}


def _schema_gaps(schema: str) -> list[str]:
    ctors = schema_constructors(schema)
    gaps = []
    in_egraph = {s.egg: n for n, s in OPS.items() if s.kind not in NOT_IN_EGRAPH}
    for egg, name in in_egraph.items():
        spec = OPS[name]
        if egg not in ctors:
            gaps.append(f"op {name}: no constructor ({egg} ...) in schema.egg")
            continue
        terms = ctors[egg].count("Term")
        arity = EGG_ARITY.get(egg, spec.arity)
        if arity is not None and terms != arity:
            gaps.append(f"op {name}: ({egg} ...) has {terms} Term arguments, the op {arity}")
        prims = [s for s in ctors[egg] if s != "Term"]
        # window ops pack their attributes in one IVec (ir/window_ops.py)
        want = ["IVec"] if spec.kind == WINDOW else [EGG_SORTS[s][0] for _, s in spec.egg_attrs]
        if prims != want:
            gaps.append(
                f"op {name}: ({egg} ...) takes {' '.join(prims) or 'no attributes'} after its "
                f"operands, the registry's egg_attrs {' '.join(want) or 'none'}"
            )
    for ctor in ctors:
        if ctor not in in_egraph and ctor not in LEAVES and ctor not in SCHEMA_ONLY:
            gaps.append(f"schema.egg constructor {ctor} is no op of the registry")
        if ctor not in ("Var", "Lit") and not re.search(rf"\(= e \({ctor}[ )]", schema):
            gaps.append(f"schema.egg constructor {ctor} has no shape/dtype analysis rule")
    return gaps


def _adjoint_gaps(adjoint: str) -> list[str]:
    heads = adjoint_heads(adjoint)
    gaps = []
    by_egg = {s.egg: s for s in OPS.values()}
    by_egg.update({k: OPS[v] for k, v in SCHEMA_ONLY.items()})
    for name, spec in OPS.items():
        if not spec.differentiable or spec.kind in NOT_IN_EGRAPH:
            continue
        for i in range(EGG_ARITY.get(spec.egg, spec.arity) or 0):
            if i not in spec.nondiff_operands and (i, spec.egg) not in heads:
                gaps.append(f"op {name}: no rule (Adjoint {i} ({spec.egg} ...) g) in adjoint.egg")
    for i, egg in sorted(heads):
        spec = by_egg.get(egg)
        if spec is None:
            gaps.append(f"adjoint.egg: a rule for {egg}, which no op of the registry has")
        elif not spec.differentiable or i in spec.nondiff_operands:
            gaps.append(
                f"adjoint.egg: a rule for operand {i} of {egg}, which the registry "
                "declares non-differentiable"
            )
        elif i >= (EGG_ARITY.get(egg, spec.arity) or 0) and egg not in SCHEMA_ONLY:
            gaps.append(f"adjoint.egg: a rule for operand {i} of {egg}, which has fewer")
    return gaps


def _registry_gaps() -> list[str]:
    gaps = []
    for name, spec in OPS.items():
        if spec.kind in ELEMENTWISE_KINDS:
            if spec.cost not in COST_FLOPS:
                gaps.append(f"op {name}: elementwise without a cost class of COST_FLOPS")
            if spec.kernel is None and spec.kind != SELECT:
                gaps.append(f"op {name}: elementwise without a kernel name")
        if spec.arity in (1, 2) and spec.kind in ELEMENTWISE_KINDS and spec.kind != SELECT:
            if spec.scalar is None:
                what = "unary" if spec.arity == 1 else "binary"
                gaps.append(f"op {name}: {what} without a kernel formula (scalar)")
        if spec.kind in SYMBOLIC_KINDS and spec.symbolic is None:
            gaps.append(f"op {name}: no meaning on sympy arrays (symbolic) for verify")
        # control flow's rules (bodies batched with Batcher.batch_body) are not written yet
        if spec.batch is None and spec.kind not in NOT_IN_EGRAPH:
            gaps.append(f"op {name}: no batching rule (vmap)")
    return gaps


def declared_constructors(text: str) -> dict[str, tuple[str, ...]]:
    """Constructor -> argument sorts of every `(constructor C (sorts) Term ...)` of a rule file."""
    found = re.finditer(r"\(constructor\s+(\w+)\s+\(([^()]*)\)\s+Term\b", _strip_comments(text))
    return {m.group(1): tuple(m.group(2).split()) for m in found}


def _egraph_only_gaps(texts: dict[str, str]) -> list[str]:
    gaps = []
    ops = {s.egg for s in OPS.values()}
    declared: dict[str, tuple[str, tuple[str, ...]]] = {}
    for name, text in texts.items():
        found = schema_constructors(text) if name == "schema.egg" else {}
        found.update(declared_constructors(text))
        for ctor, sorts in found.items():
            declared.setdefault(ctor, (name, sorts))
            if name != "schema.egg" and ctor not in ops and ctor not in EGRAPH_ONLY:
                gaps.append(
                    f"{name} constructor {ctor} is no op of the registry and has no e-graph-only "
                    "entry (ir/registry/egraph_only.py)"
                )
    for egg, spec in EGRAPH_ONLY.items():
        where = declared.get(egg)
        if where is None or where[0] != spec.rule_file:
            gaps.append(f"e-graph-only {egg}: no (constructor {egg} ...) in {spec.rule_file}")
            continue
        if spec.op is None:
            continue
        terms = where[1].count("Term")
        if len(where[1]) - terms != spec.prims:
            gaps.append(
                f"e-graph-only {egg}: {len(where[1]) - terms} primitive arguments in "
                f"{spec.rule_file}, its entry {spec.prims}"
            )
        if spec.op not in OPS:
            gaps.append(f"e-graph-only {egg}: stands for {spec.op}, which is no op")
        elif terms != spec.terms or spec.terms != OPS[spec.op].arity:
            gaps.append(
                f"e-graph-only {egg}: {terms} Term arguments, its entry {spec.terms}, "
                f"op {spec.op} {OPS[spec.op].arity}"
            )
        if spec.through is not None and spec.through not in OPS:
            gaps.append(f"e-graph-only {egg}: reads through {spec.through}, which is no op")
    return gaps


def registry_gaps(
    schema: str | None = None, adjoint: str | None = None, rules: dict[str, str] | None = None
) -> list[str]:
    """Every disagreement between the registry, rules/schema.egg, rules/adjoint.egg and the
    other shipped rule files' constructors (or the texts given: `rules` maps a file name to
    its text), one line each; empty when they agree."""
    texts = {n: rule_file(n).read_text() for n in SHIPPED}
    texts.update(rules or {})
    if schema is not None:
        texts["schema.egg"] = schema
    if adjoint is not None:
        texts["adjoint.egg"] = adjoint
    schema = texts["schema.egg"]
    if adjoint is None:  # the attention op's adjoints live beside it (issue 33)
        adjoint = texts["adjoint.egg"] + texts["attention_adjoint.egg"]
    return (
        _schema_gaps(schema) + _adjoint_gaps(adjoint) + _registry_gaps() + _egraph_only_gaps(texts)
    )


__all__ = ["registry_gaps"]
