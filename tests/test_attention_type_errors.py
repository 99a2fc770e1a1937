"""The attention op's type errors (ir/attention_op.py): formatted when read, not when raised
(verify-rules' shape search meets ~10^5 ill-typed candidates per rank-4 rule and reads none),
and still saying the same thing, through the IR builder and through verify-rules' Evaluator."""

from __future__ import annotations

import pytest

from dlvm_eq.egraph.rulefiles import read_rule_file, rule_file
from dlvm_eq.errors import IRError
from dlvm_eq.ir.attention_op import AttentionTypeError, attention_backward_type, attention_type
from dlvm_eq.ir.types import DType, TensorType
from dlvm_eq.verify.obligation import obligations
from dlvm_eq.verify.pattern import PCall, PLit, PVar, Vocab
from dlvm_eq.verify.terms import Evaluator, Untypable

F32, F64 = DType.f32, DType.f64


def t(*shape, dtype=F32):
    return TensorType(shape, dtype)


CASES = [  # (types, attrs, the message as the eager f-strings wrote it)
    ([t(2, 3)] * 3, {}, "expected four tensor operands: q, k, v, bias"),
    (
        [t(2, 3), t(2, 3), t(2, 3), t(dtype=F64)],
        {},
        f"operands must share one floating-point type: {t(2, 3)}, {t(2, 3)}, {t(2, 3)}, "
        f"{t(dtype=F64)}",
    ),
    (
        [t(2, 3), t(1, 2, 3), t(2, 3), t()],
        {},
        f"q, k and v need equal ranks from 2 to 4: {t(2, 3)}, {t(1, 2, 3)}, {t(2, 3)}",
    ),
    (
        [t(1, 2, 3), t(2, 2, 3), t(2, 2, 3), t()],
        {},
        f"batch dimensions differ: {t(1, 2, 3)}, {t(2, 2, 3)}, {t(2, 2, 3)}",
    ),
    (
        [t(2, 3), t(5, 4), t(5, 4), t()],
        {},
        f"q·kᵀ or the product with v does not type-check: {t(2, 3)}, {t(5, 4)}, {t(5, 4)}",
    ),
    (
        [t(2, 3), t(5, 3), t(5, 4), t(3, 5)],
        {},
        f"bias {t(3, 5)} does not broadcast to the scores' shape {(2, 5)}",
    ),
    ([t(2, 3), t(5, 3), t(5, 4), t()], {"causal": 2}, "causal must be 0 or 1, not 2"),
]


@pytest.mark.parametrize("types, attrs, want", CASES)
def test_messages_read_as_before(types, attrs, want):
    with pytest.raises(IRError) as err:
        attention_type(types, attrs)
    assert isinstance(err.value, AttentionTypeError)
    assert str(err.value) == "attention: " + want


def test_backward_messages_read_as_before():
    q, k, v = t(2, 3), t(5, 3), t(5, 4)
    with pytest.raises(IRError, match="attentionBackward expects six operands"):
        attention_backward_type([q, k, v, t()], {"wrt": 0})
    out = t(2, 4)
    with pytest.raises(IRError) as err:
        attention_backward_type([q, k, v, t(), out, t(2, 5)], {"wrt": 0})
    want = f"attention: o and g must have the attention's type {out}: {out}, {t(2, 5)}"
    assert str(err.value) == want
    with pytest.raises(IRError) as err:
        attention_backward_type([q, k, v, t(), out, out], {"wrt": 3})
    assert str(err.value) == "attention: wrt must be 0 (q), 1 (k) or 2 (v), not 3"


def _evaluator() -> Evaluator:
    vocab = Vocab()
    text, name = read_rule_file(rule_file("schema.egg"))
    obligations(text, name, vocab)
    return Evaluator(vocab)


def test_verify_rules_evaluator_keeps_the_message_and_its_cache_answers_alike():
    ev = _evaluator()
    term = PCall(
        "Attention",
        (PVar("q"), PVar("k"), PVar("v"), PVar("b"), PLit(0.5, "f64"), PLit(0, "i64")),
    )
    asg = {"q": t(1, 2, 3), "k": t(2, 2, 3), "v": t(2, 2, 3), "b": t()}
    want = f"attention: batch dimensions differ: {t(1, 2, 3)}, {t(2, 2, 3)}, {t(2, 2, 3)}"
    for _ in range(2):  # the first computes the type, the second reads the cache
        with pytest.raises(Untypable) as err:
            ev.type(term, asg)
        assert str(err.value) == want
    good = dict(asg, q=t(2, 2, 3))
    assert ev.type(term, good) == t(2, 2, 3)
