"""Cuts of the cold compile path (issue 32) give the same programs: the adjoint expansion's
growing steps (egraph/saturate.py: egglog's `repeat` runs every iteration, changed or not),
deletes sent to egglog in chunks (egraph/session.py), and greedy fusion skipping candidates it
already rejected while nothing changed (extract/fusion_cost.py). Oracles: the reference
interpreter in float64 against central differences, a one-iteration-per-step expansion, one
text of deletes, and greedy fusion as it was first written (kept below)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_programs import random_function

import dlvm_eq as dq
from dlvm_eq.egraph import load_bindings
from dlvm_eq.egraph.fusion_decision import decide_fusion
from dlvm_eq.extract import fusion_cost
from dlvm_eq.extract.fusion_cost import _Evaluator, _key
from dlvm_eq.ir import F64, FunctionBuilder, Module, tensor
from dlvm_eq.ir.inline import flatten
from dlvm_eq.ir.interp import run_function
from dlvm_eq.ir.printer import print_function

pytestmark = pytest.mark.usefixtures("no_ir_cache")  # every adjoint is built here (conftest.py)


def _chain(depth: int) -> Module:
    """sum(tanh(x*x + x)) `depth` times, on 5 float64s."""
    b = FunctionBuilder("f", [tensor(5, F64)], ["x"])
    (x,) = b.params
    for _ in range(depth):
        x = b.emit("tanh", [b.emit("add", [b.emit("multiply", [x, x]), x])])
    m = Module("m")
    m.add(b.finish(b.emit("reduce", [x], combinator="add", init=0.0, axes=(0,))))
    return m


def _value(x, depth):
    for _ in range(depth):
        x = np.tanh(x * x + x)
    return x.sum()


def _adjoint_steps(monkeypatch, module) -> tuple[list[int], object]:
    """(iterations of each adjoint expansion step sent to egglog, the gradient function)."""
    load_bindings()
    from dlvm_eq.ad import adjoint_function
    from dlvm_eq.egraph.session import EGraphSession

    steps: list[int] = []
    real = EGraphSession.run_text

    def recording(self, text, filename="<egglog>"):
        if re.search(r"\(run(-with bo)? adjoint\)", text):
            m = re.search(r"\(repeat (\d+) ", text)
            steps.append(int(m.group(1)) if m else 1)
        return real(self, text, filename)

    monkeypatch.setattr(EGraphSession, "run_text", recording)
    grad = adjoint_function(module, module["f"])
    monkeypatch.setattr(EGraphSession, "run_text", real)
    return steps, grad


@pytest.mark.parametrize("depth", [2, 12])
def test_the_expansion_starts_at_one_iteration_and_doubles(monkeypatch, depth):
    m = _chain(depth)
    steps, grad = _adjoint_steps(monkeypatch, m)
    # before: 64 iterations a step, and a second step of 64 to see nothing change
    assert steps[0] == 1 and steps == [min(2**i, 64) for i in range(len(steps))]
    assert sum(steps) < 64
    x = np.linspace(-0.6, 0.5, 5)
    got = run_function(None, grad, [x], float64=True)
    h, want = 1e-6, np.empty(5)
    for i in range(5):
        e = np.zeros(5)
        e[i] = h
        want[i] = (_value(x + e, depth) - _value(x - e, depth)) / (2 * h)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7 * max(1.0, np.abs(want).max()))


def test_the_growing_expansion_gives_the_program_one_iteration_per_step_gives(monkeypatch):
    from dlvm_eq.ad import driver
    from dlvm_eq.egraph.ruleset_schedule import Schedule

    m = _chain(20)
    _, grown = _adjoint_steps(monkeypatch, m)
    monkeypatch.setattr(driver, "EXPANSION", Schedule(("adjoint",), step=1))
    steps, single = _adjoint_steps(monkeypatch, m)
    assert set(steps) == {1}
    assert print_function(grown) == print_function(single)


def test_deletes_go_in_chunks_and_leave_what_one_text_leaves(monkeypatch):
    load_bindings()
    from dlvm_eq.egraph.lets import Let
    from dlvm_eq.egraph.optimize import new_session
    from dlvm_eq.egraph.saturate import node_count
    from dlvm_eq.egraph.session import EGraphSession

    def graph(one_text: bool):
        s = new_session(shipped=())
        lets = [Let(f"$v{i}_", "Var", (f"x{i}",)) for i in range(150)]
        s.add_lets(lets)
        tanhs = [Let(f"$t{i}_", "Tanh", (lets[i],)) for i in range(150)]
        s.add_lets(tanhs)
        texts = []
        real = EGraphSession.run_text

        def recording(self, text, filename="<egglog>"):
            texts.append(text)
            return real(self, text, filename)

        with monkeypatch.context() as mp:
            mp.setattr(EGraphSession, "run_text", recording)
            if one_text:
                s.run_text("\n".join(f"(delete {t.term(s.values.ref)})" for t in tanhs[::2]))
            else:
                s.delete(tanhs[::2])
        return texts, node_count(s), sorted(s.serialize([t.name for t in tanhs[1::2]]).classes)

    texts, nodes, classes = graph(one_text=False)
    assert len(texts) == 2 and all(t.count("(delete") <= 64 for t in texts)
    assert (nodes, classes) == graph(one_text=True)[1:]
    assert nodes == 150 + 75  # the Vars, and the tanhs not deleted


# ---------------------------------------------------------------- greedy fusion


def reference_greedy(p, passes: int = 3) -> tuple[frozenset, float, int]:
    """greedy_fusion as first written (no budgets, no skipping): (materialized, cost,
    evaluations)."""
    ev = _Evaluator(p)
    mat: set = set()
    groups = ev.groups(mat)
    state = {g: ev.kernel(ms, mat) for g, ms in groups.items()}

    def reads(c):
        return any(c in s.expanded for s in state.values())

    def delta(c, add):
        new = set(mat) | {c} if add else set(mat) - {c}
        k = p.cand_of[c]
        gk = _key(k)
        members = dict(groups)
        ms = [m for m in members.get(gk, []) if m.cls != c] + ([k] if add else [])
        if ms:
            members[gk] = ms
        else:
            members.pop(gk, None)
        touched = {g for g, s in state.items() if c in s.expanded or c in s.loaded} | {gk}
        changes, d = {}, 0.0
        for g in touched:
            old = state[g].cost if g in state else 0.0
            if g in members:
                changes[g] = ev.kernel(members[g], new)
                d += changes[g].cost - old
            else:
                changes[g] = None
                d -= old
        return d, members, changes

    def apply(c, add, members, changes):
        nonlocal groups
        (mat.add if add else mat.discard)(c)
        groups = members
        for g, s in changes.items():
            if s is None:
                state.pop(g, None)
            else:
                state[g] = s

    for k in reversed(p.candidates):
        if not reads(k.cls):
            continue
        d, members, changes = delta(k.cls, True)
        if d < 0:
            apply(k.cls, True, members, changes)
    for _ in range(passes):
        improved = False
        for k in reversed(p.candidates):
            add = k.cls not in mat
            if add and not reads(k.cls):
                continue
            d, members, changes = delta(k.cls, add)
            if d < -1e-15:
                apply(k.cls, add, members, changes)
                improved = True
        if not improved:
            break
    cost = sum(s.cost for s in state.values())
    ev.total({k.cls for k in p.candidates})  # the unfused cost, as greedy_fusion reports it
    return frozenset(mat), cost, ev.count


def _problems(flat) -> list:
    seen = []
    real = fusion_cost.greedy_fusion

    def capture(problem, *args, **kwargs):
        seen.append(problem)
        return real(problem, *args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(fusion_cost, "greedy_fusion", capture)
        decide_fusion(flat)
    return seen


@settings(
    deadline=None,
    derandomize=True,
    max_examples=20,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_greedy_fusion_chooses_what_its_first_version_chose(data):
    fn = random_function(data.draw, n_ops=data.draw(st.integers(3, 14)), max_dim=32)
    for p in _problems(flatten(fn, None)):
        got = fusion_cost.greedy_fusion(p)
        mat, cost, evaluations = reference_greedy(p)
        assert got.materialized == mat and got.cost == cost
        assert got.evaluations <= evaluations


def test_greedy_fusion_prices_a_chain_once_per_candidate_where_nothing_changes():
    def deep(x):
        for _ in range(30):
            x = dq.tanh(x * x + x)
        return dq.sum(x)

    module = dq.make_ir(dq.grad(deep))(np.linspace(-0.5, 0.5, 6).astype(np.float32))
    fn = module[next(iter(module.functions))]
    (p,) = _problems(flatten(fn, module))
    got = fusion_cost.greedy_fusion(p)
    mat, cost, evaluations = reference_greedy(p)
    assert got.materialized == mat and got.cost == cost
    # before: every candidate priced again in an improvement pass that changed nothing
    assert got.evaluations < 0.6 * evaluations
