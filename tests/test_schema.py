"""rules/schema.egg and the op table agree both ways; rule-file constructors are known."""

from __future__ import annotations

import re

from dlvm_eq.egraph import registry_check
from dlvm_eq.egraph.rulefiles import SHIPPED, rule_file
from dlvm_eq.egraph.serialized import EGG_TO_OP, LEAVES
from dlvm_eq.ir.ops import CALL, CONTROL, LITERAL, OPS, TUPLE
from dlvm_eq.ir.registry import EGRAPH_ONLY
from dlvm_eq.ir.registry.egraph_only import IR_FORM, READ_AS

# ops the loader removes before the e-graph: literals become Const/Lit, tuples become several
# roots, extract picks one, apply is inlined; control flow is split off by the pipeline (loops.py)
NOT_IN_EGRAPH = (LITERAL, TUPLE, CALL, CONTROL)


def schema_constructors() -> dict[str, int]:
    """Constructor name -> number of arguments, from the `(datatype Term ...)` block."""
    text = rule_file("schema.egg").read_text()
    return {name: len(sorts) for name, sorts in registry_check.schema_constructors(text).items()}


def test_every_op_has_its_constructor():
    ctors = schema_constructors()
    for name, spec in OPS.items():
        if spec.kind in NOT_IN_EGRAPH:
            continue
        assert spec.egg in ctors, f"op {name} has no constructor {spec.egg} in schema.egg"


def test_every_constructor_is_an_op_or_a_leaf():
    ops_egg = {spec.egg for spec in OPS.values() if spec.kind not in NOT_IN_EGRAPH}
    # the IR's slice with a step: an op's other spelling (ir/registry/egraph_only.py)
    ops_egg |= {e for e, spec in EGRAPH_ONLY.items() if spec.role == IR_FORM}
    assert "StridedSlice" in ops_egg
    for ctor in schema_constructors():
        assert ctor in ops_egg or ctor in LEAVES, f"schema.egg constructor {ctor} is no IR op"


def test_operand_counts_agree():
    ctors = schema_constructors()
    for name, spec in OPS.items():
        if spec.kind in NOT_IN_EGRAPH or spec.arity is None:
            continue
        terms = sum(1 for a in re.findall(r"\w+", _signature(spec.egg)) if a == "Term")
        assert terms == spec.arity, (
            f"{spec.egg}: {terms} Term arguments, op {name} has arity {spec.arity}"
        )
    assert set(EGG_TO_OP) <= set(ctors)


def _signature(ctor: str) -> str:
    text = rule_file("schema.egg").read_text()
    return re.search(rf"\({ctor}((?: \w+)*)\)", text).group(1)


def test_every_constructor_has_a_shape_rule():
    text = rule_file("schema.egg").read_text()
    for ctor in schema_constructors():
        if ctor in ("Var", "Lit"):  # the loader sets their shapes
            continue
        assert re.search(rf"\(= e \({ctor} ", text), f"no shape/dtype analysis rule for {ctor}"


def test_rule_file_constructors_unload():
    """Constructors the shipped rule files add to Term are ops or have an e-graph-only entry;
    those extraction may choose (Gemm) decode to an op (they unload to it)."""
    added = {}
    for name in SHIPPED:
        added.update(registry_check.declared_constructors(rule_file(name).read_text()))
    assert {"Gemm", "Adjoint", "SumTo", "Map"} <= set(added)
    ops_egg = {spec.egg for spec in OPS.values()}
    for ctor in added:
        assert ctor in ops_egg or ctor in EGRAPH_ONLY, ctor
    read_as = [e for e, spec in EGRAPH_ONLY.items() if spec.role == READ_AS]
    assert read_as == ["Gemm"]
    for egg in read_as:
        spec = EGRAPH_ONLY[egg]
        assert spec.op in OPS and spec.attrs is not None and spec.reads is not None
