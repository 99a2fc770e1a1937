"""rules/loops.egg's control rules (Cond, Case, ScanOf; egraph/control_regions.py): a cond or
switch whose selector the caller's e-graph proves constant runs its taken branch in place of
the op, and a scan of one step runs its body once; each fires where it must, not where it must
not, names its rule in the report, and keeps the interpreter's result in float64."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.ir import Module, interpret, verify
from dlvm_eq.ir.control_flow import module_with_bodies

RNG = np.random.default_rng(30)


def optimized(f, *args):
    """(the traced module, the optimized module, its name, the report's text)."""
    m = dq.make_ir(f)(*args)
    name = next(iter(m.functions))
    res = dq.optimize(m, name, never_slower=False)  # the rules' result, not the guard's
    out = Module("t")
    module_with_bodies(out, res.module[name])
    verify(out)
    return m, out, name, str(res.report)


def ops(m: Module, name: str) -> list[str]:
    return [i.op for i in m[name].body]


def same(m0: Module, m1: Module, name: str, *args) -> None:
    """Both modules on float64 arguments give the same results."""
    args64 = [np.asarray(a, np.float64) if np.asarray(a).dtype.kind == "f" else a for a in args]
    got, want = interpret(m1, name, *args64), interpret(m0, name, *args64)
    got, want = (x if isinstance(x, tuple) else (x,) for x in (got, want))
    for g, w in zip(got, want):
        w = np.asarray(w, np.float64)
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(w).max()))


def x3():
    return RNG.standard_normal(3).astype(np.float32)


def test_a_constant_cond_and_switch_run_their_taken_branch_in_place():
    def f(x):
        return dq.cond(True, dq.sin, dq.cos, x) + dq.switch(7, [dq.exp, dq.tanh], x)

    x = x3()
    m0, m1, name, report = optimized(f, x)
    assert "cond" not in ops(m1, name) and "switch" not in ops(m1, name)
    assert {"sin", "tanh"} <= set(ops(m1, name)) and not {"cos", "exp"} & set(ops(m1, name))
    assert "cond-true" in report and "switch-passed" in report  # 7 is past the last branch
    same(m0, m1, name, x)


def test_a_switch_index_picks_its_branch_clamped_as_jax_does():
    branches = [dq.sin, dq.cos, dq.exp]
    for k, want, rule in (
        (-2, "sin", "switch-taken"),
        (1, "cos", "switch-taken"),
        (2, "exp", "switch-passed"),
    ):

        def f(x, k=k):
            return dq.switch(k, branches, x)

        x = x3()
        m0, m1, name, report = optimized(f, x)
        assert "switch" not in ops(m1, name) and want in ops(m1, name), (k, ops(m1, name))
        assert rule in report
        same(m0, m1, name, x)


def test_a_selector_computed_in_the_caller_folds_there():
    """The selector is the caller's term (2 > 1, not a literal operand of the cond)."""

    def f(x):
        two = dq.full((), 2.0, "f32")
        return dq.cond(two > 1.0, lambda v: v * 3.0, dq.exp, x)

    x = x3()
    m0, m1, name, report = optimized(f, x)
    assert "cond" not in ops(m1, name) and "exp" not in ops(m1, name)
    assert "greaterThan" in ops(m0, name) and "cond-true" in report
    same(m0, m1, name, x)


def test_a_selector_from_an_argument_keeps_the_op():
    def f(p, k, x):
        return dq.cond(p, dq.sin, dq.cos, x) + dq.switch(k, [dq.exp, dq.tanh], x)

    x = x3()
    m0, m1, name, report = optimized(f, np.bool_(True), np.int32(1), x)
    assert "cond" in ops(m1, name) and "switch" in ops(m1, name)
    assert "cond-true" not in report and "switch-" not in report
    for p, k in ((True, 0), (False, 5)):
        same(m0, m1, name, np.bool_(p), np.int32(k), x)


def test_a_scan_of_one_step_runs_its_body_once_with_pytree_carries_either_way():
    w = RNG.standard_normal((3, 3)).astype(np.float32)
    for reverse in (False, True):

        def f(h, c, xs, reverse=reverse):
            def step(carry, x):
                h, c = carry["h"], carry["c"]
                h2 = dq.tanh(h @ w + x["a"] * c)
                return {"h": h2, "c": c + x["b"]}, (h2, c * 2.0)

            carry, ys = dq.scan(step, {"h": h, "c": c}, xs, reverse=reverse)
            return carry["h"], carry["c"], ys[0], ys[1]

        h, c = RNG.standard_normal((2, 3)).astype(np.float32), x3()
        xs = {"a": RNG.standard_normal((1, 3)).astype(np.float32), "b": RNG.standard_normal((1, 3))}
        xs["b"] = xs["b"].astype(np.float32)
        m0, m1, name, report = optimized(f, h, c, xs)
        assert "scan" not in ops(m1, name) and "tanh" in ops(m1, name)
        assert "scan-one-step" in report
        same(m0, m1, name, h, c, xs["a"], xs["b"])


def test_longer_scans_and_while_loops_stay_loops():
    def f(h, xs):
        h = dq.scan(lambda h, x: (dq.sin(h) + x, None), h, xs)[0]
        return dq.while_loop(lambda v: dq.sum(v) < 10.0, lambda v: v + 1.0, h)

    h = np.abs(x3())
    for steps in (0, 2):
        xs = RNG.standard_normal((steps, 3)).astype(np.float32)
        m0, m1, name, report = optimized(f, h, xs)
        assert "scan" in ops(m1, name) and "while" in ops(m1, name)
        assert "scan-one-step" not in report
        same(m0, m1, name, h, xs)


def test_a_constant_cond_in_a_scan_body_runs_in_place_there():
    def f(h, xs):
        def step(h, x):
            return dq.cond(False, dq.sin, lambda v: v * 0.5 + x, h), None

        return dq.scan(step, h, xs)[0]

    h, xs = x3(), RNG.standard_normal((4, 3)).astype(np.float32)
    m0, m1, name, report = optimized(f, h, xs)
    (scan,) = [i for i in m1[name].body if i.op == "scan"]
    assert "cond" not in [i.op for i in scan.attrs["body"].body]
    assert "cond-false" in report
    same(m0, m1, name, h, xs)


def test_a_constant_cond_with_pytree_results_and_a_loop_in_its_branch():
    def f(h, xs):
        def looped(v):
            h, xs = v
            return dq.scan(lambda c, x: (c * 0.5 + x, None), h, xs)[0], dq.sum(h)

        return dq.cond(False, lambda v: (v[0], dq.sum(v[1])), looped, (h, xs))

    h, xs = x3(), RNG.standard_normal((3, 3)).astype(np.float32)
    m0, m1, name, report = optimized(f, h, xs)
    assert "cond" not in ops(m1, name) and "scan" in ops(m1, name)
    assert "cond-false" in report
    same(m0, m1, name, h, xs)


def test_one_step_and_two_step_scans_of_one_body_are_not_confused():
    """The e-graph's choices are cached by the units' text, which a scan's length is not in."""
    f = dq.jit(lambda h, xs: dq.scan(lambda h, x: (dq.sin(h) + x, h * 2.0), h, xs))
    h = x3()
    for steps in (1, 2, 1):
        xs = RNG.standard_normal((steps, 3)).astype(np.float32)
        got = f(h, xs)
        want, ys = h.astype(np.float64), []
        for x in xs:
            ys.append(want * 2.0)
            want = np.sin(want) + x
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], np.stack(ys), rtol=1e-5, atol=1e-6)
        assert ("scan-one-step" in str(f.report(h, xs))) == (steps == 1)


def test_jit_runs_the_decided_program():
    f = dq.jit(lambda x: dq.switch(1, [dq.sin, dq.cos], x) * 2.0)
    x = x3()
    np.testing.assert_allclose(f(x), np.cos(x.astype(np.float64)) * 2.0, rtol=1e-5, atol=1e-6)
    report = str(f.report(x))
    assert "switch-passed" in report and "parts" in report


# ---------------------------------------------------------------- random programs
UNARY = [dq.sin, dq.tanh, lambda v: v * 0.5, lambda v: v + 1.0]
part = st.tuples(
    st.sampled_from(["cond const", "cond arg", "switch const", "scan"]),
    st.integers(-2, 4),  # a switch's index, a cond's selector (odd: true), a scan's length
    st.booleans(),  # reverse
    st.integers(0, 3),
    st.integers(0, 3),
)


def build(parts):
    def f(p, x):
        for kind, k, reverse, a, b in parts:
            fa, fb = UNARY[a], UNARY[b]
            if kind == "cond const":
                x = dq.cond(k % 2 == 1, fa, fb, x)
            elif kind == "cond arg":
                x = dq.cond(p, fa, fb, x)
            elif kind == "switch const":
                x = dq.switch(k, [fa, fb, dq.cos], x)
            else:
                xs = dq.zeros((max(k, 0), 3), "f32") + 0.25
                x = dq.scan(lambda h, s: (fa(h) + s, fb(h)), x, xs, reverse=reverse)[0]
        return x

    return f


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(part, min_size=1, max_size=4), st.booleans())
def test_random_programs_keep_the_interpreters_result(parts, p):
    x = x3()
    m0, m1, name, report = optimized(build(parts), np.bool_(p), x)
    left = ops(m1, name)
    consts = sum(1 for kind, *_ in parts if kind in ("cond const", "switch const"))
    ones = sum(1 for kind, k, *_ in parts if kind == "scan" and k == 1)
    assert left.count("cond") + left.count("switch") == len(parts) - consts - sum(
        1 for kind, *_ in parts if kind == "scan"
    )
    assert left.count("scan") == sum(1 for kind, k, *_ in parts if kind == "scan") - ones
    same(m0, m1, name, np.bool_(p), x)
