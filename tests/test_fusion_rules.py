"""rules/fusion.egg: generated from the op table (they agree), loads after the schema, and the
fusion e-graph's saturation always stops, by the budget when the budget is small."""

from __future__ import annotations

import re

import numpy as np

import dlvm_eq as dq
from dlvm_eq.egraph.fusion_decision import fusion_graph, load_fusion
from dlvm_eq.egraph.fusion_rules import fusion_rules_text, schema_signatures
from dlvm_eq.egraph.rulefiles import rule_file
from dlvm_eq.egraph.ruleset_schedule import Budget
from dlvm_eq.ir.inline import flatten
from dlvm_eq.ir.ops import CAST, ELEMENTWISE_KINDS, LAYOUT, OPS


def _flat(fn, *args):
    m = dq.make_ir(fn)(*args)
    name = next(iter(m.functions))
    return flatten(m[name], m)


def test_fusion_egg_is_the_generated_text():
    # regenerate with: python -m dlvm_eq.egraph.fusion_rules > rules/fusion.egg
    assert rule_file("fusion.egg").read_text() == fusion_rules_text()


def test_every_elementwise_op_has_a_scalar_op_and_a_map_rule_and_nothing_else():
    text = rule_file("fusion.egg").read_text()
    declared = set(re.findall(r"^  \((S[A-Z]\w*) ", text, re.M))
    fusible = {n for n, s in OPS.items() if s.kind in ELEMENTWISE_KINDS or s.kind == CAST}
    views = {n for n, s in OPS.items() if s.kind == LAYOUT and s.arity == 1}
    assert declared == {"S" + OPS[n].egg for n in fusible | views}
    for n in fusible:
        egg = OPS[n].egg
        rules = re.findall(rf"\(rewrite \({egg} [^\n]*\(Map \(S{egg} ", text)
        assert len(rules) == 1, f"{n}: expected one Map rule"
        arity = sum(1 for s in schema_signatures()[egg] if s == "Term")
        assert arity == (OPS[n].arity or 0), n
    for n in views:
        assert re.search(
            rf"\(rewrite \(Load \({OPS[n].egg} t[^\n]*\(S{OPS[n].egg} \(Load t\)", text
        ), n
    assert "(rewrite (Load (Map s)) s :ruleset fusion)" in text


def test_saturation_builds_maps_and_reads_and_stops():
    x = np.ones((8, 4), np.float32)
    b = np.ones((4,), np.float32)
    loaded = load_fusion(_flat(lambda x, b: dq.exp(x + b) * 2.0, x, b))
    data, facts = fusion_graph(loaded)
    assert facts["stop_reason"] == "saturated" and facts["iterations"] <= 6
    ops = [n["op"] for n in data["nodes"].values()]
    assert ops.count("Map") == 3  # add, exp, multiply
    assert {"SAdd", "SExp", "SMultiply", "SBroadcast", "Load"} <= set(ops)


def test_a_small_budget_stops_saturation_and_everything_is_materialized():
    from dlvm_eq.egraph.fusion_decision import decide_fusion

    x = np.ones((8, 4), np.float32)
    flat = _flat(lambda x: dq.tanh(dq.exp(x + 1.0) * x) - x, x)
    _, facts = fusion_graph(load_fusion(flat), Budget(iterations=1, nodes=10**6, seconds=10))
    assert facts["stop_reason"] == "iterations" and facts["iterations"] == 1
    _, facts = fusion_graph(load_fusion(flat), Budget(iterations=50, nodes=5, seconds=10))
    assert facts["stop_reason"] == "nodes" and facts["iterations"] == 0
    d = decide_fusion(flat, budget=Budget(iterations=1, nodes=10**6, seconds=10))
    ew = [i.result for i in flat.body if i.op in ("add", "exp", "multiply", "tanh", "subtract")]
    assert all(id(v) in d.materialize for v in ew)
    assert "not saturated" in d.report.note
