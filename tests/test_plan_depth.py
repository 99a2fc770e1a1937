"""The planner's work grows with the program, not with its square (issue 32), and plans stay
the same: shared rebuilds per kernel (kernels/rows.Rebuilt), the cycle check's levels
(planning/group_levels.py), memoized op counts at splits (shared_values.ops_counted) and one
numbering walk per kernel text (kernels/spec_text.py), each against the code it replaced (kept
here, or switched back by patching) on random programs and long chains."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_programs import random_module

from dlvm_eq.codegen import plan_flat
from dlvm_eq.codegen.kernels.kernel_spec import KernelInput, KernelSpec
from dlvm_eq.codegen.kernels.spec import Expr, Load, Unary, walk
from dlvm_eq.codegen.kernels.spec_text import spec_text
from dlvm_eq.codegen.planning import group_levels, kernel_groups, shared_values
from dlvm_eq.codegen.planning.shared_values import ops_counted, ops_within
from dlvm_eq.egraph.fusion_decision import decide_fusion
from dlvm_eq.ir import F64, FunctionBuilder, Module, tensor
from dlvm_eq.ir.inline import KERNEL_EXPR_OPS, flatten

SLOW = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)


class _Forgetful:
    """A kernels/rows.Rebuilt that remembers nothing: every rebuild walks its whole DAG (the
    planner before shared rebuilds)."""

    @property
    def new(self) -> dict:
        return {}

    @property
    def seen(self) -> set:
        return set()


def _old_ways(monkeypatch) -> None:
    monkeypatch.setattr(kernel_groups, "Rebuilt", _Forgetful)
    monkeypatch.setattr(group_levels.GroupLevels, "placed", lambda *a: False)  # no stops
    monkeypatch.setattr(shared_values, "OP_SETS_KEPT", 0)  # every count walks


def _text(plan) -> str:
    """The printed plan (less the fusion stage's time) and every kernel's full spec."""
    text = re.sub(r"; [0-9.]+ ms", "", str(plan))
    for step in plan.steps:
        kernel = getattr(step, "epilogue", None) or step
        if getattr(kernel, "spec", None) is not None:
            text += "\n" + spec_text(kernel.spec)
    return text


def _plans_both_ways(module: Module, monkeypatch) -> tuple[str, str]:
    name = next(iter(module.functions))
    flat = flatten(module[name], module)
    decision = decide_fusion(flat, "cpu")
    new = _text(plan_flat(flat, name, decision))
    with monkeypatch.context() as m:
        _old_ways(m)
        old = _text(plan_flat(flat, name, decision))
    return new, old


@st.composite
def modules(draw):
    return random_module(draw, n_ops=draw(st.integers(5, 40)))


@SLOW
@given(module=modules())
def test_random_programs_plan_as_before(monkeypatch, module):
    new, old = _plans_both_ways(module, monkeypatch)
    assert new == old


def _chain(picks) -> Module:
    """v_i = tanh(op(v_i-1, v_b)) or sin(v_i-1), v_b up to 40 values behind, and every 50th value
    also a result: longer than a kernel (splits, shared values) with many materialized values."""
    b = FunctionBuilder("f", [tensor(6, F64)], ["x"])
    vals = list(b.params)
    for kind, back, binop in picks:
        a, c = vals[-1], vals[-1 - back % len(vals)]
        if kind == 0:
            vals.append(b.emit("sin", [a]))
        else:
            y = b.emit(("add", "multiply", "subtract")[binop], [a, c])
            vals.append(b.emit("tanh", [y]))
    m = Module("m")
    m.add(b.finish([vals[-1]] + vals[1::50]))
    return m


@SLOW
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 2)),
        min_size=KERNEL_EXPR_OPS,
        max_size=3 * KERNEL_EXPR_OPS,
    )
)
def test_long_chains_plan_as_before(monkeypatch, picks):
    new, old = _plans_both_ways(_chain(picks), monkeypatch)
    assert new == old


# ------------------------------------------------------------------ op counts at splits


@st.composite
def dags(draw):
    """A random expression DAG: each node an op of earlier nodes (shared), as a list."""
    nodes: list[Expr] = [Load(i) for i in range(draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(1, 60))):
        a = nodes[draw(st.integers(0, len(nodes) - 1))]
        if draw(st.booleans()):
            nodes.append(Unary(draw(st.sampled_from(("tanh", "exp", "neg"))), a))
        else:
            b = nodes[draw(st.integers(0, len(nodes) - 1))]
            nodes.append(a * b if draw(st.booleans()) else a + b)
    return nodes


@settings(max_examples=300, deadline=None)
@given(nodes=dags(), limit=st.integers(0, 40), kept=st.integers(1, 8), data=st.data())
def test_memoized_op_counts_are_the_walks(nodes, limit, kept, data):
    memo: dict = {}
    old_kept = shared_values.OP_SETS_KEPT
    shared_values.OP_SETS_KEPT = kept  # few kept: evictions and misses too
    try:
        for _ in range(20):
            e = nodes[data.draw(st.integers(0, len(nodes) - 1))]
            want = ops_within(e, limit)
            got = ops_counted(e, limit, memo)
            if want <= limit:
                assert got == want
            else:
                assert got > limit
            assert len(memo) <= kept
    finally:
        shared_values.OP_SETS_KEPT = old_kept


def test_a_shared_chain_is_counted_at_its_dag_size():
    x, memo = Load(0), {}
    for i in range(1, 200):
        x = x * x + x
        assert ops_counted(x, 1000, memo) == 2 * i  # a tree of 3^i nodes
    assert ops_counted(x, 100, {}) > 100


# ------------------------------------------------------------------ kernel text


def _old_spec_text(spec) -> str:
    """spec_text as it was: a walk from every root, numbered nodes skipped."""
    nodes: list[str] = []
    ids: dict[int, int] = {}

    def number(root: Expr) -> int:
        for e in walk([root]):
            if id(e) not in ids:
                body = ",".join(enc(getattr(e, f.name)) for f in dataclasses.fields(e))
                ids[id(e)] = len(nodes)
                nodes.append(f"{type(e).__name__}({body})")
        return ids[id(root)]

    def enc(v) -> str:
        if isinstance(v, Expr):
            i = ids.get(id(v))
            return f"#{number(v) if i is None else i}"
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return (
                f"{type(v).__name__}("
                + ",".join(f"{f.name}={enc(getattr(v, f.name))}" for f in dataclasses.fields(v))
                + ")"
            )
        if isinstance(v, (tuple, list)):
            return "(" + ",".join(enc(x) for x in v) + ",)"
        return repr(v)

    top = enc(spec)
    return top + "\n" + "\n".join(nodes)


@settings(max_examples=200, deadline=None)
@given(nodes=dags(), data=st.data())
def test_kernel_text_numbers_as_before(nodes, data):
    outs = data.draw(st.lists(st.sampled_from(nodes[1:] or nodes), min_size=1, max_size=6))
    n_in = 1 + max((e.index for e in walk(outs) if isinstance(e, Load)), default=0)
    spec = KernelSpec("k", (6,), [KernelInput("f32")] * n_in, outs)
    assert spec_text(spec) == _old_spec_text(spec)


@pytest.mark.parametrize("depth", [2_000])
def test_a_deep_chain_plans_without_recursion(depth):
    m = _chain([(1, 1 + i % 37, i % 3) for i in range(depth)])
    name = "f"
    flat = flatten(m[name], m)
    plan = plan_flat(flat, name, decide_fusion(flat, "cpu"))
    assert len(plan.kernels) > depth // KERNEL_EXPR_OPS  # split along the chain
