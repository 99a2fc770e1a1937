"""Rule files compiled once per thread and reused between (push) and (pop): the shared session
gives exactly the programs a fresh one gives, sessions stay per thread, and nothing of one
compile (its program, a user's rule file) reaches the next."""

from __future__ import annotations

import gc
import re
import threading

import pytest
from egglog.bindings import EGraph
from hypothesis import HealthCheck, given, settings
from ir_programs import functions

import dlvm_eq as dq
from dlvm_eq.ad.driver import adjoint_function
from dlvm_eq.egraph import optimize as optimize_mod
from dlvm_eq.egraph.rule_program import parsed_program, top_level_spans
from dlvm_eq.egraph.rulefiles import SHIPPED, read_rule_file, rule_file
from dlvm_eq.egraph.saturate import node_count
from dlvm_eq.egraph.session import RuleFileError
from dlvm_eq.errors import DlvmError
from dlvm_eq.ir import Module
from dlvm_eq.pipeline.planning import plan_function

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def _compiled(fn, module):
    """(optimized IR, adjoint IR, fusion plan) of one function, as text."""
    opt = dq.optimize(module).module
    grad = ""
    if fn.result_type.__class__.__name__ == "TensorType" and fn.result_type.dtype.is_float:
        if any(p.type.dtype.is_float for p in fn.params):
            grad = str(adjoint_function(module, fn))
    plan = plan_function(opt[fn.name], opt)
    return str(opt), grad, re.sub(r"; [0-9.]+ [mun]?s\n", "\n", str(plan))  # not its time


@settings(max_examples=12, **SETTINGS)
@given(functions(n_ops=12))
def test_the_shared_session_gives_what_a_fresh_one_gives(fn):
    # (no_ir_cache is not a fixture here: hypothesis runs the body many times per fixture)
    from dlvm_eq import config

    module = Module("m")
    module.add(fn)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("DLVM_EQ_NO_IR_CACHE", "1")
        config.reload()
        try:
            shared = _compiled(fn, module)
            m.setattr(optimize_mod, "_bases", lambda: {})  # every stage makes a fresh session
            fresh = _compiled(fn, module)
        finally:
            m.delenv("DLVM_EQ_NO_IR_CACHE")
            config.reload()
    assert shared == fresh


@pytest.mark.parametrize("name", SHIPPED)
def test_a_rule_file_parsed_form_by_form_is_the_file_parsed_whole(name):
    text, filename = read_rule_file(rule_file(name))
    whole = EGraph().parse_program(text, filename=filename)
    split = parsed_program(text, filename)
    assert [str(c) for c in split] == [str(c) for c in whole]
    # egglog names an unnamed rule by its text: the spans must cover the same text
    for a, b in zip(split, whole):
        if hasattr(a, "rule"):
            sa, sb = a.rule.span, b.rule.span
            text_a = sa.file.contents.encode()[sa.i : sa.j]  # egglog's offsets are bytes
            assert text_a == sb.file.contents.encode()[sb.i : sb.j]


def test_a_mistake_is_located_in_the_whole_file():
    s = optimize_mod.new_session(shipped=())
    text = "(ruleset mine)\n\n(rewrite (Exp x) (NoSuchOp x) :ruleset mine)\n"
    with pytest.raises(RuleFileError) as e:
        s.add_rules_text(text, "mine.egg")
    assert (e.value.line, e.value.column) == (3, 18), e.value
    assert top_level_spans("(a) stray") is None  # parsed whole: egglog says what is wrong
    with pytest.raises(RuleFileError) as e:
        s.add_rules_text("(ruleset r)\n(rewrite (Exp x)", "open.egg")
    assert e.value.line == 2, e.value
    # The raised error's traceback holds this frame, and so the session: a cycle. Collected
    # later on another thread, egglog warns that its EGraph was dropped off its thread.
    del e, s
    gc.collect()


def test_sessions_are_per_thread():
    mine = optimize_mod._base_session(())[1]
    seen = []

    def other_thread():
        theirs = optimize_mod._base_session(())[1]
        seen.append((theirs is mine, theirs.thread == threading.get_ident()))
        try:
            mine.run_text("(print-size)")
        except DlvmError as e:
            seen.append(str(e))
        del theirs  # (an egglog EGraph must be dropped on its own thread)
        optimize_mod._LOCAL.__dict__.clear()

    t = threading.Thread(target=other_thread)
    t.start()
    t.join(120)
    assert seen[0] == (False, True)
    assert "thread" in seen[1]
    assert mine.thread == threading.get_ident()
    assert optimize_mod._base_session(())[1] is mine  # reused on this thread


def test_a_compile_leaves_the_base_session_as_it_found_it():
    m = dq.parse(PROGRAM)
    _, base = optimize_mod._base_session(())
    before = (node_count(base), len(base.values.marks), list(base.rulesets))
    dq.optimize(m)
    with pytest.raises(ValueError), optimize_mod.scratch_session() as s:
        s.add_function(m["f"], m)
        raise ValueError("a failure inside a stage")
    assert optimize_mod._base_session(())[1] is base  # popped back, not thrown away
    assert (node_count(base), len(base.values.marks), list(base.rulesets)) == before


PROGRAM = """
module "m"
stage raw
func @f: (<2 x 3 x f32>) -> <2 x 3 x f32> {
'entry(%x: <2 x 3 x f32>):
    %0 = softplus %x: <2 x 3 x f32>
    %1 = negate %x: <2 x 3 x f32>
    %2 = softplus %1: <2 x 3 x f32>
    %3 = subtract %0: <2 x 3 x f32>, %2: <2 x 3 x f32>
    return %3: <2 x 3 x f32>
}
"""


def test_a_user_rule_file_does_not_reach_the_next_compile(tmp_path, no_ir_cache):
    rules = tmp_path / "mine.egg"
    rules.write_text(
        "(ruleset mine)\n(rewrite (Subtract (Softplus x) (Softplus (Negate x))) x :ruleset mine)\n"
    )
    m = dq.parse(PROGRAM)
    with_rules = dq.optimize(m, rules=[rules], never_slower=False)  # the rules, not the guard
    assert with_rules.report["f"].ops_after == 0  # softplus(x) - softplus(-x) = x
    without = dq.optimize(m, never_slower=False)
    assert without.report["f"].ops_after > 0
    fired = without.report["f"].saturation.rule_matches
    assert not any("Softplus (Negate" in r for r in fired), fired
    assert "mine" not in optimize_mod._base_session(())[1].rulesets
