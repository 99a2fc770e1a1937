"""Random programs with loops (hypothesis): random elementwise scan bodies, lengths 0, 1 and
many, reverse, a scan nested in the body, a cond in the body, a value closed over. The cpu
compile equals the reference interpreter, and so does its gradient."""

from __future__ import annotations

import operator

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq

UNARY = [dq.tanh, dq.sin, dq.sigmoid, lambda v: v * 0.5]
BINARY = [operator.add, operator.mul, operator.sub]
SHAPE = (3,)


def run_ops(ops, values):
    vals = list(values)
    for kind, k, a, b in ops:
        if kind == 0:
            vals.append(UNARY[k % len(UNARY)](vals[a % len(vals)]))
        else:
            vals.append(BINARY[k % len(BINARY)](vals[a % len(vals)], vals[b % len(vals)]))
    return vals


op_lists = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, 3), st.integers(0, 20), st.integers(0, 20)),
    min_size=1,
    max_size=5,
)


@st.composite
def programs(draw):
    return {
        "carries": draw(st.integers(1, 2)),
        "xs": draw(st.integers(0, 2)),
        "ys": draw(st.integers(0, 1)),
        "length": draw(st.sampled_from([0, 1, 5])),
        "reverse": draw(st.booleans()),
        "body": draw(op_lists),
        "nested": draw(st.sampled_from(["none", "scan", "cond"])),
        "inner": draw(op_lists),
        "other": draw(op_lists),
        "pick": draw(st.integers(0, 20)),
    }


def build(p):
    nc, ny = p["carries"], p["ys"]

    def f(w, *args):
        carries, xs = args[:nc], args[nc:]

        def body(c, x):
            vals = run_ops(p["body"], [*c, *x, w])
            v = vals[p["pick"] % len(vals)]
            if p["nested"] == "scan":  # an inner scan closing over the outer step's values

                def inner(d, _):
                    return run_ops(p["inner"], [d, v])[-1], None

                vals.append(dq.scan(inner, vals[-1], None, length=2)[0])
            elif p["nested"] == "cond":
                vals.append(
                    dq.cond(
                        dq.sum(v) > 0.0,
                        lambda u: run_ops(p["inner"], [u, w])[-1],
                        lambda u: run_ops(p["other"], [u])[-1],
                        vals[-1],
                    )
                )
            new = tuple(dq.tanh(vals[-1 - k]) for k in range(nc))
            return new, (vals[-1] * 1.0 if ny else None)

        c, ys = dq.scan(body, tuple(carries), tuple(xs), length=p["length"], reverse=p["reverse"])
        total = sum(dq.sum(ci * ci) for ci in c)
        return total + (dq.sum(ys) if ny else 0.0)

    return f


def arguments(p, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(SHAPE).astype(np.float32)
    cs = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(p["carries"])]
    xs = [rng.standard_normal((p["length"], *SHAPE)).astype(np.float32) for _ in range(p["xs"])]
    return [w, *cs, *xs]


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs(), st.integers(0, 2**16))
def test_compiled_loops_equal_the_interpreter(p, seed):
    f, args = build(p), arguments(p, seed)
    want = dq.jit(f, target="interp")(*args)
    got = dq.jit(f, target="cpu")(*args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    argnums = tuple(range(len(args)))
    g_want = dq.jit(dq.grad(f, argnums=argnums), target="interp")(*args)
    g_got = dq.jit(dq.grad(f, argnums=argnums), target="cpu")(*args)
    for g, w in zip(g_got, g_want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs(), st.integers(0, 2**16))
def test_gradients_of_random_loops_match_finite_differences(p, seed):
    f = build(p)
    args = [a.astype(np.float64) for a in arguments(p, seed)]
    grads = dq.jit(dq.grad(f, argnums=tuple(range(len(args)))), target="interp")(*args)
    run = dq.jit(f, target="interp")
    rng = np.random.default_rng(seed + 1)
    d = [rng.standard_normal(a.shape) for a in args]
    eps = 1e-6
    up = float(run(*(a + eps * v for a, v in zip(args, d))))
    down = float(run(*(a - eps * v for a, v in zip(args, d))))
    fd = (up - down) / (2 * eps)
    directional = sum(float(np.sum(g * v)) for g, v in zip(grads, d))
    assert abs(directional - fd) <= 1e-6 * max(1.0, abs(fd))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs(), st.integers(0, 2**16))
def test_loop_rules_keep_the_interpreters_result(p, seed):
    from dlvm_eq.ir import Module, verify
    from dlvm_eq.ir.control_flow import module_with_bodies
    from dlvm_eq.ir.loop_rules import apply_loop_rules

    args = arguments(p, seed)
    m = dq.make_ir(build(p))(*args)
    fn = next(iter(m.functions.values()))
    rewritten = Module("rules")
    module_with_bodies(rewritten, apply_loop_rules(fn))
    verify(rewritten)
    got = dq.interpret(rewritten, fn.name, *args)
    np.testing.assert_allclose(got, dq.interpret(m, fn.name, *args), rtol=1e-5, atol=1e-6)
