"""dq.optimize on functions with loops and branches (egraph/optimize_loops.py): the straight
pieces of the function and of every body are loaded into ONE e-graph session, saturated once
and extracted jointly; a body run by two loops is loaded once; the result runs as the
interpreter runs the original. rules/loops.egg folds constant selectors (checked by
verify-rules), after which the loop rules inline the taken branch; they do not fire on a
selector that is not constant."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.egraph import optimize_loops
from dlvm_eq.egraph.optimize import scratch_session
from dlvm_eq.egraph.rulefiles import rule_file
from dlvm_eq.ir import Module, interpret, verify
from dlvm_eq.ir.control_flow import COND, module_with_bodies, reachable_bodies
from dlvm_eq.ir.loop_rules import apply_loop_rules
from dlvm_eq.ir.parser import load, parse

DATA = Path(__file__).parent / "data" / "control_flow"
RNG = np.random.default_rng(11)


def traced(f, *args) -> Module:
    fn = next(iter(dq.make_ir(f)(*args).functions.values()))
    m = Module("t")
    module_with_bodies(m, fn)
    return m


def ops_of(fn) -> list[str]:
    out = [i.op for i in fn.body]
    for b in reachable_bodies(fn):
        out += [i.op for i in b.body]
    return out


def same_results(a: Module, b: Module, name: str, *args) -> None:
    want, got = interpret(a, name, *args), interpret(b, name, *args)
    for g, w in zip(
        got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)
    ):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_pieces_and_bodies_share_one_session(monkeypatch):
    sessions, loaded = [], []
    real = optimize_loops.scratch_session

    def spy(rules=()):
        cm = real(rules)

        class Wrap:
            def __enter__(self):
                s = cm.__enter__()
                sessions.append(s)
                add = s.add_function
                s.add_function = lambda fn, module=None: loaded.append(fn.name) or add(fn, module)
                return s

            def __exit__(self, *exc):
                return cm.__exit__(*exc)

        return Wrap()

    monkeypatch.setattr(optimize_loops, "scratch_session", spy)
    w = RNG.standard_normal((3, 3)).astype(np.float32)

    def f(h, xs):
        step = lambda h, x: (dq.tanh(h @ w + x * 1.0), h + 0.0)
        h, ys = dq.scan(step, h, xs)
        h2, _ = dq.scan(step, h, xs)  # the same Python body, traced again
        return h2 * 2.0 + dq.sum(ys)

    h, xs = (
        RNG.standard_normal(3).astype(np.float32),
        RNG.standard_normal((4, 3)).astype(np.float32),
    )
    m = traced(f, h, xs)
    r = dq.optimize(m, "f", never_slower=False)  # the rules' result, not the guard's choice
    assert len(sessions) == 1  # one e-graph for the function, its pieces and its bodies
    assert any(".piece" in n for n in loaded) and len(loaded) >= 3
    verify(r.module)
    same_results(m, r.module, "f", h, xs)
    # the bodies were optimized by the same rules: x * 1.0 and h + 0.0 are gone
    new = r.module["f"]
    for b in reachable_bodies(new):
        body_ops = [i.op for i in b.body]
        assert "multiply" not in body_ops
        assert body_ops.count("add") == 1  # tanh(h @ w + x): the + 0.0 went


def test_a_body_two_loops_run_is_loaded_once():
    m = load(DATA / "loops.dl")
    fn = m["pick"]  # @neg is a branch of the cond and two branches of the switch
    units = optimize_loops.straight_units(fn, m)
    names = [u.label for u in units]
    assert sum("@neg" in n for n in names) == 1, names


@pytest.mark.parametrize("name", ["main", "loop", "pick", "count"])
def test_optimized_loops_dl_runs_as_the_interpreter(name):
    m = load(DATA / "loops.dl")
    r = dq.optimize(m, name)
    verify(r.module)
    fn = m[name]
    args = [
        np.bool_(True)
        if t.dtype.numpy == np.bool_
        else np.int32(1)
        if t.dtype.numpy == np.int32
        else RNG.standard_normal(t.shape).astype(np.float32)
        for t in fn.param_types
    ]
    same_results(m, r.module, name, *args)


CONST_SELECTOR = """module "c"
stage raw

func @yes: (<4 x f32>) -> <4 x f32> {
'entry(%x: <4 x f32>):
    %0 = negate %x: <4 x f32>
    return %0: <4 x f32>
}

func @no: (<4 x f32>) -> <4 x f32> {
'entry(%x: <4 x f32>):
    %0 = exp %x: <4 x f32>
    return %0: <4 x f32>
}

func @f: (<4 x f32>, f32) -> <4 x f32> {
'entry(%x: <4 x f32>, %t: f32):
    %two = literal 2.0: f32
    %p = greaterThan %two: f32, SELECTOR
    %r = cond %p: bool then @yes else @no(%x: <4 x f32>)
    return %r: <4 x f32>
}
"""


def test_a_selector_the_rules_fold_makes_the_cond_fold():
    m = parse(CONST_SELECTOR.replace("SELECTOR", "1.5: f32"))
    r = dq.optimize(m, "f", never_slower=False)  # the rules' result, not the guard's choice
    fn = r.module["f"]
    assert COND not in ops_of(fn) and "negate" in ops_of(fn)  # 2 > 1.5: the then branch
    x = RNG.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(interpret(r.module, "f", x, np.float32(0)), -x)
    m = parse(CONST_SELECTOR.replace("SELECTOR", "3.0: f32"))
    fn = dq.optimize(m, "f", never_slower=False).module["f"]
    assert COND not in ops_of(fn) and "exp" in ops_of(fn)  # 2 > 3 is false


def test_a_selector_that_is_not_constant_keeps_the_cond():
    m = parse(CONST_SELECTOR.replace("SELECTOR", "%t: f32"))
    r = dq.optimize(m, "f")
    assert COND in ops_of(r.module["f"])
    x = RNG.standard_normal(4).astype(np.float32)
    for t in (1.0, 3.0):
        same_results(m, r.module, "f", x, np.float32(t))


def test_loop_rules_file_is_proven_by_verify_rules():
    from dlvm_eq.verify.rules import verify_rules

    report = verify_rules([rule_file("loops.egg")])  # (after algebra.egg: its cval)
    mine = report.results
    assert len(mine) == 62  # 22 folds, 32 loop-motion rules, 8 control (Cond, Case, ScanOf)
    assert all(r.status == "proven" for r in mine), [
        (r.where, r.status) for r in mine if r.status != "proven"
    ]


def test_fold_rules_fire_and_do_not_fire_in_the_e_graph():
    from dlvm_eq.ir.module import FunctionBuilder
    from dlvm_eq.ir.types import F32, TensorType

    def loaded(b_value):
        b = FunctionBuilder("g", [TensorType((), F32)], ["t"])
        two = b.emit("literal", [], value=2.0, type=TensorType((), F32))
        other = (
            b.params[0]
            if b_value is None
            else b.emit("literal", [], value=b_value, type=TensorType((), F32))
        )
        fn = b.finish(b.emit("lessThan", [two, other]))
        with scratch_session() as s:
            prog = s.add_function(fn)
            s.run_text("(run-schedule (saturate (run analysis) (run loops)))")
            out = s.run_text(f"(extract {prog.roots[0]})")
        return " ".join(map(str, out))

    assert 'Const 1.0 "bool"' in loaded(3.0)  # 2 < 3
    assert 'Const 0.0 "bool"' in loaded(1.0)
    assert "LessThan" in loaded(None)  # 2 < t: nothing to fold


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["scan", "cond", "while", "scan of cond"]),
    st.integers(0, 3),
    st.floats(-2, 2),
    st.integers(0, 2**16),
)
def test_random_loops_optimize_to_the_same_results(shape, steps, k, seed):
    def f(x, w):
        def body(h, xv):
            v = dq.tanh(h * w + xv * 1.0) + (h - h)
            if shape == "scan of cond":
                v = dq.cond(dq.sum(v) > k, lambda v: v * 0.5, lambda v: dq.sin(v), v)
            return v, v * 2.0

        if shape == "cond":
            return dq.cond(dq.sum(x) > k, lambda x: x * w, lambda x: x - w, x)
        if shape == "while":
            return dq.while_loop(lambda c: c[0] < steps, lambda c: (c[0] + 1, c[1] * w), (0, x))[1]
        return dq.scan(body, x, dq.stack([x] * steps) if steps else np.zeros((0, 3), np.float32))[0]

    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((2, 3)).astype(np.float32)
    m = traced(f, x, w)
    name = next(iter(m.functions))
    r = dq.optimize(m, name)
    verify(r.module)
    same_results(m, r.module, name, x, w)


def test_a_value_the_e_graph_makes_invariant_leaves_the_body():
    def f(h, xs, w, v, hoist):
        def step(h, x):
            # h - h is 0, so ((h - h) + w) @ v is w @ v: invariant, once the e-graph says so
            shift = ((h - h) + w) @ v if hoist else (h * 0.5) @ w
            return dq.tanh(x + shift), None

        return dq.scan(step, h, xs)[0]

    h, v = RNG.standard_normal((2, 3)).astype(np.float32)
    xs = RNG.standard_normal((5, 3)).astype(np.float32)
    w = RNG.standard_normal((3, 3)).astype(np.float32)
    for hoist in (True, False):
        m = traced(lambda h, xs, w, v: f(h, xs, w, v, hoist), h, xs, w, v)
        name = next(iter(m.functions))
        r = dq.optimize(m, name)
        verify(r.module)
        same_results(m, r.module, name, h, xs, w, v)
        new = r.module[name]
        (body,) = reachable_bodies(new)
        in_body = [i.op for i in body.body]
        if hoist:  # w @ v computed once, before the scan, and passed in
            assert "dot" not in in_body and "dot" in [i.op for i in new.body]
            # the loop rules alone, on the program as written, cannot see it
            (as_written,) = reachable_bodies(apply_loop_rules(m[name]))
            assert "dot" in [i.op for i in as_written.body]
        else:  # it reads the carry: it stays
            assert "dot" in in_body


def test_a_rebuilt_body_has_no_unread_instructions():
    """A unit inlined into its rebuilt body leaves its own result tuple unread; it is dropped.
    Later rules count uses: ir/loop_sums.py defers a carry's sum only where its update has one
    reader, so a dead tuple kept an LSTM's eight weight gradients in its adjoint loop."""
    w = RNG.standard_normal((3, 3)).astype(np.float32)

    def f(h0, xs):
        def step(h, x):
            h = dq.tanh(h @ w + x)
            return h, h * 2.0

        return dq.scan(step, h0, xs)

    m = traced(
        f, RNG.standard_normal(3).astype(np.float32), RNG.standard_normal((4, 3)).astype(np.float32)
    )
    name = next(iter(m.functions))
    res = dq.optimize(m, name)
    assert res.module[name] is not m[name]  # rebuilt from its optimized units
    for body in reachable_bodies(res.module[name]):
        read = {id(o) for i in body.body for o in i.operands} | {id(body.ret)}
        assert all(id(i.result) in read for i in body.body), str(body)
