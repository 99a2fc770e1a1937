"""rules/attention.egg (issue 33): each rule fires on the spellings it is for and not on
look-alikes; extraction takes the fused `attention` op where the cost model prices it lower,
and the report says which it chose and the predicted cost of both; verify-rules proves the file."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.extract.machine import MACHINES
from dlvm_eq.ir.types import F32

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _optimized(fn, *shapes, target="cpu"):
    args = [np.zeros(s, np.float32) for s in shapes]
    module = dq.make_ir(fn)(*args)
    res = dq.optimize(module, target=target)
    return res, res.report[fn.__name__]


def _fired(fr) -> dict[str, int]:
    return {name: n for name, n in fr.saturation.rule_matches.items() if n}


def _attention_rules(fr) -> set[str]:
    return {name for name in _fired(fr) if "attention " in name}


def scaled(q, k, v):
    return dq.softmax((q @ dq.transpose(k, (0, 2, 1))) * 0.125, axis=-1) @ v


def heads(q, k, v):  # rank 4: (batch, heads, seq, head dim), as models/transformer.py
    return dq.softmax((q @ dq.transpose(k, (0, 1, 3, 2))) * 0.125, axis=-1) @ v


def prescaled_q(q, k, v):  # the scale on q, not on the scores
    return dq.softmax((q * 0.125) @ dq.transpose(k, (0, 2, 1)), axis=-1) @ v


def given_kt(q, kt, v):  # k already transposed by the user: no transpose in the program
    return dq.softmax(q @ kt, axis=-1) @ v


def extra_transpose(q, k, v):  # kᵀ written as a transpose of a transpose of a transpose
    p = (0, 2, 1)
    kt = dq.transpose(dq.transpose(dq.transpose(k, p), p), p)
    return dq.softmax((q @ kt) * 0.125, axis=-1) @ v


def with_padding(q, k, v, pad):  # pad: (batch, 1, keys), 0 or -1e9: broadcast over the queries
    return dq.softmax((q @ dq.transpose(k, (0, 2, 1))) * 0.125 + pad, axis=-1) @ v


def columns(q, k, v):  # softmax over the queries (axis 1): not attention's softmax
    return dq.softmax((q @ dq.transpose(k, (0, 2, 1))) * 0.125, axis=1) @ v


def no_product(s, v):  # softmax of a parameter: no q kᵀ to fuse
    return dq.softmax(s, axis=-1) @ v


B, M, N, D = 2, 8, 8, 4


@pytest.mark.parametrize(
    "fn, shapes, rule",
    [
        (scaled, [(B, M, D), (B, N, D), (B, N, D)], "attention 3: softmax(q kt * c) v"),
        (heads, [(1, 2, M, D), (1, 2, N, D), (1, 2, N, D)], "attention 4: softmax(q kt * c) v"),
        (prescaled_q, [(B, M, D), (B, N, D), (B, N, D)], "attention 3: softmax(q kt) v"),
        (given_kt, [(B, M, D), (B, D, N), (B, N, D)], "attention 3: softmax(q kt) v"),
        (extra_transpose, [(B, M, D), (B, N, D), (B, N, D)], "attention 3: softmax(q kt * c) v"),
        (
            with_padding,
            [(B, M, D), (B, N, D), (B, N, D), (B, 1, N)],
            "attention 3: softmax(q kt * c + b) v",
        ),
    ],
)
def test_attention_rule_fires_on_each_spelling(fn, shapes, rule):
    _, fr = _optimized(fn, *shapes)
    assert rule in _attention_rules(fr), _fired(fr)
    # the report names the fused alternative and both predicted costs, whichever won
    assert fr.attention and "predicted fused kernel" in fr.attention[0], str(fr)


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (columns, [(B, M, D), (B, N, D), (B, N, D)]),
        (no_product, [(B, M, N), (B, N, D)]),
    ],
)
def test_attention_rule_does_not_fire_on_look_alikes(fn, shapes):
    _, fr = _optimized(fn, *shapes)
    assert not _attention_rules(fr), _fired(fr)
    assert fr.attention == []


def test_plain_softmax_gets_no_online_forms():
    """The block rescaling is only for blocks of a concatenation: a plain softmax gets none."""
    _, fr = _optimized(no_product, (B, M, N), (B, N, D))
    assert not any("block" in name for name in _fired(fr)), _fired(fr)


def concat_softmax(a, b):  # a softmax over two key blocks: where the online rules apply
    x = dq.concatenate([a, b], axis=1)
    return dq.softmax(x, axis=1)


def test_online_softmax_rules_fire_on_a_concatenation():
    _, fr = _optimized(concat_softmax, (4, 3), (4, 5))
    fired = _fired(fr)
    for rule in ("max over blocks", "exp(x - m) over blocks", "sum over blocks"):
        assert rule in fired, fired
    assert "block sum rescaled (first block)" in fired, fired
    assert "block sum rescaled (second block)" in fired, fired


def slow_memory():
    """The shipped CPU machine with a hundredth of its bandwidth: writing the scores dominates,
    so the fused kernel must win."""
    import dataclasses

    cpu = MACHINES["cpu"]
    return dataclasses.replace(cpu, name="slow-memory", bandwidth=cpu.bandwidth / 100)


def test_extraction_picks_the_fused_kernel_when_it_is_cheaper():
    res, fr = _optimized(scaled, (4, 512, 64), (4, 512, 64), (4, 512, 64), target=slow_memory())
    ops = [inst.op for inst in res.module["scaled"].body]
    assert "attention" in ops, ops
    assert "exp" not in ops  # the scores never exist
    assert fr.cost_after < fr.cost_before
    assert fr.attention[0].split(":")[1].strip().startswith("fused chosen"), fr.attention


def _seconds(text: str) -> float:
    value, unit = text.split()[:2]
    return float(value) * {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]


@pytest.mark.parametrize("fn", [scaled, prescaled_q, extra_transpose])
def test_shipped_defaults_pick_the_fused_kernel_at_seq_1024(fn):
    """The shipped CPU machine, no calibration: a user's spelling (the scale on q, kᵀ behind
    three transposes) reaches the fused form through the rules and extraction takes it, and
    the report gives both predicted costs, the fused one the lower."""
    shape = (2, 1024, 64)
    res, fr = _optimized(fn, shape, shape, shape)
    assert "attention" in [inst.op for inst in res.module[fn.__name__].body]
    line = fr.attention[0]
    assert "fused chosen" in line, line
    fused, plain = (_seconds(x) for x in line.split("fused kernel ")[1].split(", plain program "))
    assert fused < plain, line


def test_shipped_defaults_pick_the_fused_backward_in_value_and_grad():
    """value_and_grad at seq 1024: the forward is fused before differentiation
    (egraph/attention_forward.py), and its adjoints are the fused backward
    (rules/attention_adjoint.egg); the report gives each one's predicted cost."""

    def loss(q, k, v):
        return dq.sum(heads(q, k, v))

    shape = (1, 4, 1024, 64)
    args = [np.zeros(shape, np.float32)] * 3
    res = dq.optimize(dq.make_ir(dq.value_and_grad(loss, argnums=(0, 1, 2)))(*args), target="cpu")
    fr = res.report["loss"]
    ops = [inst.op for inst in res.module["loss"].body]
    assert ops.count("attentionBackward") == 3, ops
    assert any("fused backward chosen" in line for line in fr.attention), fr.attention
    assert any(line.split(":")[1].strip().startswith("fused chosen") for line in fr.attention)


def test_extraction_keeps_the_plain_program_when_it_is_cheaper():
    """A tiny attention: the fused kernel's per-block overhead outweighs what it saves."""
    res, fr = _optimized(scaled, (1, 4, 2), (1, 4, 2), (1, 4, 2))
    assert "attention" not in [inst.op for inst in res.module["scaled"].body]
    assert "plain chosen" in fr.attention[0], fr.attention


def test_attention_op_type_rule_names_the_problem():
    from dlvm_eq.errors import IRError
    from dlvm_eq.ir.ops import OPS
    from dlvm_eq.ir.types import tensor

    spec = OPS["attention"]
    q, k, v = tensor(2, 3, 4, F32), tensor(2, 5, 4, F32), tensor(2, 5, 6, F32)
    assert spec.result_type([q, k, v, tensor(F32)], {"scale": 1.0, "causal": 0}).shape == (2, 3, 6)
    with pytest.raises(IRError, match="broadcast"):
        spec.result_type([q, k, v, tensor(2, 3, 4, F32)], {"scale": 1.0, "causal": 0})
    with pytest.raises(IRError, match="does not type-check"):
        spec.result_type([q, tensor(2, 5, 3, F32), v, tensor(F32)], {"scale": 1.0, "causal": 0})


def test_verify_rules_proves_attention_egg():
    """No rule fails or is skipped; with the quick budget some may be checked numerically only
    (sympy's time runs out on a loaded machine), and `dlvm-eq verify-rules --strict` proves the
    rest (tests/test_verify_rules.py's thorough run covers this file too)."""
    from dlvm_eq.egraph.rulefiles import rule_file
    from dlvm_eq.verify.rules import Settings, verify_rules
    from dlvm_eq.verify.search import Space

    quick = Settings(space=Space(limit=48), symbolic_seconds=5.0)
    report = verify_rules([str(rule_file("attention.egg"))], settings=quick)
    assert report.ok and not report.skipped, report.render()
    assert len(report.results) == 24
    assert report.count("proven") >= 10, report.render()


def causal_bias(q, k, v):  # a causal mask as users write it: -1e9 above the diagonal
    hidden = np.triu(np.full((q.shape[1], k.shape[1]), -1e9, np.float32), 1)
    return dq.softmax((q @ dq.transpose(k, (0, 2, 1))) * 0.125 + hidden, axis=-1) @ v


def causal_inf_heads(q, k, v):  # rank 4, -inf above the diagonal, the scale on q
    hidden = np.triu(np.full((q.shape[2], k.shape[2]), -np.inf, np.float32), 1)
    return dq.softmax((q * 0.125) @ dq.transpose(k, (0, 1, 3, 2)) + hidden, axis=-1) @ v


def shifted_band(q, k, v):  # a look-alike: keys hidden from j > i + 1, not causal
    hidden = np.triu(np.full((q.shape[1], k.shape[1]), -1e9, np.float32), 2)
    return dq.softmax((q @ dq.transpose(k, (0, 2, 1))) * 0.125 + hidden, axis=-1) @ v


def soft_bias(q, k, v):  # a look-alike: -10 above the diagonal only lowers those weights
    hidden = np.triu(np.full((q.shape[1], k.shape[1]), -10.0, np.float32), 1)
    return dq.softmax((q @ dq.transpose(k, (0, 2, 1))) * 0.125 + hidden, axis=-1) @ v


@pytest.mark.parametrize(
    "fn, shape", [(causal_bias, (2, 1024, 64)), (causal_inf_heads, (1, 2, 1024, 64))]
)
def test_a_causal_mask_written_as_a_bias_reaches_the_causal_mode(fn, shape):
    res, fr = _optimized(fn, shape, shape, shape)
    body = res.module[fn.__name__].body
    att = [inst for inst in body if inst.op == "attention"]
    assert att and att[0].attrs["causal"] == 1, str(res.module)
    assert "fused chosen; predicted fused kernel (causal mode)" in fr.attention[0], fr.attention
    assert not any(inst.op == "literal" and inst.result.type.rank for inst in body)  # no mask


@pytest.mark.parametrize("fn", [shifted_band, soft_bias])
def test_look_alike_masks_stay_a_bias(fn):
    shape = (2, 64, 16)
    res, fr = _optimized(fn, shape, shape, shape)
    assert "attention: causal bias (broadcast) is causal mode" not in _fired(fr), _fired(fr)
    att = [inst for inst in res.module[fn.__name__].body if inst.op == "attention"]
    assert all(inst.attrs["causal"] == 0 for inst in att)


@pytest.mark.parametrize("fn", [causal_bias, causal_inf_heads, shifted_band])
def test_masked_attention_compiled_matches_the_interpreter(fn):
    shape = (2, 300, 16) if fn is not causal_inf_heads else (1, 2, 300, 16)
    rng = np.random.default_rng(8)
    args = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    got = dq.jit(fn)(*args)
    want = dq.jit(fn, target="interp")(*[a.astype(np.float64) for a in args])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def causal_where(q, k, v):  # the mask as a selection: where(tril(ones), scores, -inf)
    keep = np.tril(np.ones((q.shape[1], k.shape[1]), bool))
    return dq.softmax(dq.where(keep, (q @ dq.transpose(k, (0, 2, 1))) * 0.125, -np.inf), -1) @ v


def causal_where_heads(q, k, v):  # rank 4, no scale
    keep = np.tril(np.ones((q.shape[2], k.shape[2]), bool))
    return dq.softmax(dq.where(keep, q @ dq.transpose(k, (0, 1, 3, 2)), -np.inf), -1) @ v


def upper_where(q, k, v):  # a look-alike: the queries see the keys at and after them
    keep = np.triu(np.ones((q.shape[1], k.shape[1]), bool))
    return dq.softmax(dq.where(keep, (q @ dq.transpose(k, (0, 2, 1))) * 0.125, -np.inf), -1) @ v


@pytest.mark.parametrize(
    "fn, shape", [(causal_where, (2, 1024, 64)), (causal_where_heads, (1, 2, 1024, 64))]
)
def test_a_causal_mask_written_as_a_selection_reaches_the_causal_mode(fn, shape):
    res, fr = _optimized(fn, shape, shape, shape)
    att = [inst for inst in res.module[fn.__name__].body if inst.op == "attention"]
    assert att and att[0].attrs["causal"] == 1, str(res.module)
    assert "(causal mode)" in fr.attention[0], fr.attention


@pytest.mark.parametrize("fn", [causal_where, causal_where_heads, upper_where])
def test_selected_masks_compiled_match_the_interpreter(fn):
    shape = (2, 300, 16) if fn is not causal_where_heads else (1, 2, 300, 16)
    rng = np.random.default_rng(9)
    args = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    got = dq.jit(fn)(*args)
    want = dq.jit(fn, target="interp")(*[a.astype(np.float64) for a in args])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if fn is upper_where:
        _, fr = _optimized(fn, shape, shape, shape)
        assert not any("where(causal" in name for name in _fired(fr)), _fired(fr)
