"""Loop rules. In the e-graph (rules/loops.egg, through dq.optimize): invariant code motion
out of a scan body and batching a per-step product with an invariant into one product over
all steps. As IR rewrites (ir/loop_rules.py): dead carries. (Constant-selector conds and
one-step scans: tests/test_control_rules.py.) Each fires where it should, not where it must
not, and keeps the interpreter's result."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.ir import Module, interpret, verify
from dlvm_eq.ir.control_flow import module_with_bodies
from dlvm_eq.ir.loop_rules import apply_loop_rules

RNG = np.random.default_rng(5)


def traced(f, *args):
    m = dq.make_ir(f)(*args)
    return m, next(iter(m.functions.values()))


def rewritten(fn):
    new = apply_loop_rules(fn)
    m = Module("rules")
    module_with_bodies(m, new)
    verify(m)
    return m, new


def _optimized(fn):
    """fn through the one e-graph of a function with loops (rules/loops.egg included)."""
    m = Module("t")
    module_with_bodies(m, fn)
    res = dq.optimize(m, fn.name)
    verify(res.module)
    return res.module, res.module[fn.name], res.report


def _ops(fn, op):
    return [i for i in fn.body if i.op == op]


def _scan_body(fn):
    return _ops(fn, "scan")[0].attrs["body"]


def rnn(w, u, b, h0, xs):
    def step(h, x):
        h = dq.tanh(x @ w + b + h @ u.T)  # u.T: invariant; x @ w + b: batchable; h @ u: not
        return h, h

    return dq.scan(step, h0, xs)


def _rnn_args(rows=(4,)):
    return (
        RNG.standard_normal((3, 5)).astype(np.float32),
        RNG.standard_normal((5, 5)).astype(np.float32),
        RNG.standard_normal(5).astype(np.float32),
        RNG.standard_normal((*rows, 5)).astype(np.float32),
        RNG.standard_normal((6, *rows, 3)).astype(np.float32),
    )


def _same(m0, m1, name, args):
    """Both run by the interpreter on float64 arguments (the rewritten one regroups the sums);
    a weight closed over is an f32 literal, so such a result is f32, and compared as one."""
    args = [np.asarray(a, np.float64) for a in args]
    got, want = interpret(m1, name, *args), interpret(m0, name, *args)
    for g, w in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want))):
        tol = 1e-9 if np.asarray(w).dtype == np.float64 else 1e-5
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * np.abs(w).max())


def _fired(report) -> str:
    return str(report)


def test_the_input_projection_is_batched_into_one_product_before_the_loop():
    args = _rnn_args()
    m0, fn = traced(rnn, *args)
    m1, new, report = _optimized(fn)
    assert "batch-step-matrix-product" in _fired(report)
    body = _scan_body(new)
    dots = _ops(body, "dot")
    assert len(dots) == 1 and dots[0].operands[0] is body.params[0]  # only h @ u.T stays
    outer_dots = _ops(new, "dot")
    assert len(outer_dots) == 1 and outer_dots[0].result.type.shape == (24, 5)  # 6 steps x 4
    scan = _ops(new, "scan")[0]
    assert scan.attrs["xs"] == 2  # the rows of x @ w + b, a new per-step input
    _same(m0, m1, "rnn", args)


def test_a_step_vector_times_an_invariant_matrix_is_batched():
    w = RNG.standard_normal((3, 4)).astype(np.float32)

    def f(h0, xs):
        return dq.scan(lambda h, x: (dq.tanh(h + x @ w), h), h0, xs)

    args = (
        RNG.standard_normal(4).astype(np.float32),
        RNG.standard_normal((7, 3)).astype(np.float32),
    )
    m0, fn = traced(f, *args)
    m1, new, report = _optimized(fn)
    assert "batch-step-vector-product" in _fired(report)
    assert not _ops(_scan_body(new), "dot")
    assert [d.result.type.shape for d in _ops(new, "dot")] == [(7, 4)]
    _same(m0, m1, "f", args)


def test_an_invariant_value_is_computed_once_before_the_loop():
    def f(w, v, h0, xs):
        return dq.scan(lambda h, x: (h * x + dq.tanh(w @ v), h), h0, xs)

    args = (
        RNG.standard_normal((3, 4)).astype(np.float32),
        RNG.standard_normal(4).astype(np.float32),
        RNG.standard_normal(3).astype(np.float32),
        RNG.standard_normal((5, 3)).astype(np.float32),
    )
    m0, fn = traced(f, *args)
    m1, new, report = _optimized(fn)
    assert "once-dot" in _fired(report) and "once-tanh" in _fired(report)
    body = _scan_body(new)
    assert not _ops(body, "dot") and not _ops(body, "tanh")
    assert len(_ops(new, "dot")) == 1 and len(_ops(new, "tanh")) == 1
    _same(m0, m1, "f", args)


def test_no_loop_motion_on_carry_dependent_values():
    def f(u, h0, xs):  # h @ u and h * x read the carry: they stay, whatever u is
        return dq.scan(lambda h, x: (dq.tanh(h * x + h @ u), h), h0, xs)

    args = (
        RNG.standard_normal((3, 3)).astype(np.float32),
        RNG.standard_normal(3).astype(np.float32),
        RNG.standard_normal((4, 3)).astype(np.float32),
    )
    m0, fn = traced(f, *args)
    m1, new, report = _optimized(fn)
    assert "batch-step" not in _fired(report)
    assert _ops(new, "scan")[0].attrs["xs"] == 1 and not _ops(new, "dot")
    assert len(_ops(_scan_body(new), "dot")) == 1
    _same(m0, m1, "f", args)


def test_a_product_of_two_per_step_operands_is_not_batched():
    def f(h0, xs, ys):  # x_t @ y_t: both change per step, neither is invariant
        return dq.scan(lambda h, xy: (h + xy[0] @ xy[1], h), h0, (xs, ys))

    args = (
        RNG.standard_normal(4).astype(np.float32),
        RNG.standard_normal((5, 3)).astype(np.float32),
        RNG.standard_normal((5, 3, 4)).astype(np.float32),
    )
    m0, fn = traced(f, *args)
    m1, new, report = _optimized(fn)
    assert "batch-step" not in _fired(report)
    assert len(_ops(_scan_body(new), "dot")) == 1 and not _ops(new, "dot")
    _same(m0, m1, "f", args)


def test_a_lower_rank_step_value_is_not_batched_against_a_wider_invariant():
    def f(m, xs):  # x_t: (3,), m: (2, 3): stacking x gives (T, 3), which would not broadcast
        return dq.scan(lambda c, x: (c + x * m, c), m * 0.0, xs)

    args = (
        RNG.standard_normal((2, 3)).astype(np.float32),
        RNG.standard_normal((4, 3)).astype(np.float32),
    )
    m0, fn = traced(f, *args)
    m1, new, _ = _optimized(fn)
    assert _ops(_scan_body(new), "multiply")
    _same(m0, m1, "f", args)


def test_a_dead_carry_goes_and_a_live_one_stays():
    def f(x):  # the counter is dead: the body ignores i and the result drops it
        return dq.fori_loop(0, 5, lambda i, v: dq.sin(v), x)

    def g(x):  # here the body reads i: it stays
        return dq.fori_loop(0, 5, lambda i, v: v * i.astype("f32"), x)

    x = RNG.standard_normal(3).astype(np.float32)
    for fun, carries in ((f, 1), (g, 2)):
        m0, fn = traced(fun, x)
        assert _ops(fn, "scan")[0].attrs["carries"] == 2
        m1, new = rewritten(fn)
        assert _ops(new, "scan")[0].attrs["carries"] == carries
        np.testing.assert_allclose(
            interpret(m1, fun.__name__, x), interpret(m0, fun.__name__, x), rtol=1e-6
        )


# ---------------------------------------------------------------- random RNN-like bodies
UNARY = [dq.tanh, dq.sigmoid, lambda v: v * 0.5]
BINARY = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b]
step_ops = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 9), st.integers(0, 9)),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(step_ops, st.sampled_from([2, 5]), st.booleans(), st.booleans(), st.integers(0, 2**16))
def test_random_bodies_with_products_keep_the_interpreters_result(ops, n, reverse, rows, seed):
    """Bodies over a carry h, a step x, invariants W, U, c: products x @ W (batchable), v @ U
    (batchable only where v is), elementwise ops of all; optimized with the loop-motion rules,
    run by the interpreter in float64, equal to the original."""

    def f(w, u, c, h0, xs):
        def step(h, x):
            vals = [h, x @ w, c]
            for kind, k, a, b in ops:
                va, vb = vals[a % len(vals)], vals[b % len(vals)]
                if kind == 0:
                    vals.append(UNARY[k](va))
                elif kind == 1:
                    vals.append(BINARY[k](va, vb))
                else:
                    vals.append(va @ u)
            new = dq.tanh(vals[-1] + h)
            return new, vals[-1]

        return dq.scan(step, h0, xs, reverse=reverse)

    rng = np.random.default_rng(seed)
    lead = (2,) if rows else ()
    args = (
        rng.standard_normal((3, 4)),
        rng.standard_normal((4, 4)) * 0.5,
        rng.standard_normal((*lead, 4)),
        rng.standard_normal((*lead, 4)),
        rng.standard_normal((n, *lead, 3)),
    )
    m0, fn = traced(f, *[a.astype(np.float32) for a in args])
    m1, _, _ = _optimized(fn)
    _same(m0, m1, "f", args)


def test_what_a_loop_computes_once_is_priced_at_its_share_of_a_step():
    """extract/target_cost.py: under (StepOf s n v), v's e-nodes cost 1/n of their own cost (v
    is computed once for n steps); the StepOf is a row read a step; elsewhere nothing changes."""
    from dlvm_eq.extract.graph import load_json
    from dlvm_eq.extract.target_cost import TargetCost
    from dlvm_eq.ir.types import F32, TensorType

    def node(op, kids, cls):
        return {"op": op, "children": kids, "eclass": cls, "cost": 1.0}

    g = load_json(
        {
            "nodes": {
                "X": node("Var", ["pX"], "cX"),
                "W": node("Var", ["pW"], "cW"),
                "D": node("Dot", ["X", "W"], "cD"),  # the stacked product, (n*4, 8) @ (8, 8)
                "d": node("Dot", ["X", "W"], "cd"),  # the same product outside any loop
                "S": node("StepOf", ["pl", "pn", "D"], "cS"),
                "pX": node('"u0.x.all"', [], "pX"),
                "pW": node('"u0.w"', [], "pW"),
                "pl": node('"u0"', [], "pl"),
                "pn": node("16", [], "pn"),
            },
            "class_data": {c: {"type": "Term"} for c in ("cX", "cW", "cD", "cd", "cS")},
            "root_eclasses": ["cS", "cd"],
        }
    )
    types = {
        "cX": TensorType((64, 8), F32),
        "cW": TensorType((8, 8), F32),
        "cD": TensorType((64, 8), F32),
        "cd": TensorType((64, 8), F32),
        "cS": TensorType((4, 8), F32),
    }
    cost = TargetCost("cpu", types)
    whole = cost.step_cost(g, "D")
    assert whole > 0 and cost.step_cost(g, "d") == whole
    assert cost.node_cost(g, "D") == pytest.approx(whole / 16)
    assert cost.node_cost(g, "d") == whole  # not under a loop: its full cost
    # the StepOf: its row's traffic and the fresh pages of its stacked value, a row a step
    mc, row_bytes = cost.machine, 4 * 8 * 4
    want = mc.node_overhead + row_bytes * (2 / mc.bandwidth + 1.7e-6 / 4096)
    assert cost.node_cost(g, "S") == pytest.approx(want)


SHARED = """module "shared"
stage raw

func @step: (<4 x f32>, <3 x f32>, <3 x 4 x f32>) -> (<4 x f32>, <4 x f32>) {
'entry(%h: <4 x f32>, %x: <3 x f32>, %w: <3 x 4 x f32>):
    %0 = dot %x: <3 x f32>, %w: <3 x 4 x f32>
    %1 = add %0: <4 x f32>, %h: <4 x f32>
    %2 = tanh %1: <4 x f32>
    %3 = literal (%2: <4 x f32>, %h: <4 x f32>): (<4 x f32>, <4 x f32>)
    return %3: (<4 x f32>, <4 x f32>)
}

func @f: (<3 x 4 x f32>, <4 x f32>, <5 x 3 x f32>, <6 x 3 x f32>) -> <4 x f32> {
'entry(%w: <3 x 4 x f32>, %h0: <4 x f32>, %xs: <5 x 3 x f32>, %ys: <6 x 3 x f32>):
    %0 = scan @step carry (%h0: <4 x f32>) over (%xs: <5 x 3 x f32>) with (%w: <3 x 4 x f32>) length 5
    %1 = extract 0 from %0: (<4 x f32>, <5 x 4 x f32>)
    %2 = scan @step carry (%h0: <4 x f32>) over (%ys: <6 x 3 x f32>) with (%w: <3 x 4 x f32>) length 6
    %3 = extract 0 from %2: (<4 x f32>, <6 x 4 x f32>)
    %4 = add %1: <4 x f32>, %3: <4 x f32>
    return %4: <4 x f32>
}
"""


def test_a_body_two_scans_run_is_not_given_either_scans_rows():
    """One body run by two scans of other operands: its parameter stands for neither scan's
    rows alone, so no StepOf/Once fact ties it and x @ w stays in the body."""
    from dlvm_eq.ir.parser import parse

    m0 = parse(SHARED)
    (body,) = {
        id(i.attrs["body"]): i.attrs["body"] for i in m0["f"].body if i.op == "scan"
    }.values()
    res = dq.optimize(m0, "f")
    verify(res.module)
    assert "batch-step" not in str(res.report)
    new = res.module["f"]
    assert not _ops(new, "dot")
    assert all(len(_ops(i.attrs["body"], "dot")) == 1 for i in _ops(new, "scan"))
    args = (
        RNG.standard_normal((3, 4)),
        RNG.standard_normal(4),
        RNG.standard_normal((5, 3)),
        RNG.standard_normal((6, 3)),
    )
    _same(m0, res.module, "f", args)
