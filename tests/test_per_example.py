"""rules/per_example.egg (issue 31): the DP-SGD step -- per-example gradients by vmap(grad),
each clipped to norm C, summed over the batch -- computed without storing the per-example
gradients. The rules are proved by verify-rules; they fire on the traced step (both ways users
write it) and leave alone a per-example gradient that is returned or that is not an outer
product; the step's value is checked against a float64 numpy loop over the examples (the
hand-written MLP gradient of models/mlp.py), on the optimized program, on interp and on cpu."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.egraph import RuleFileError
from dlvm_eq.egraph.optimize import scratch_session
from dlvm_eq.egraph.rulefiles import rule_file
from dlvm_eq.egraph.ruleset_schedule import Budget, Schedule
from dlvm_eq.egraph.saturate import saturate
from dlvm_eq.ir.interp import interpret
from dlvm_eq.models import mlp

RNG = np.random.default_rng(0)
RULES = ("per-example-sq-norm", "per-example-scaled-sum", "per-example-scaled-sum'")


# ---------------------------------------------------------------- the step, as users write it
def clipped_inside(C, one_row=False):
    """JAX's DP-SGD: vmap over examples of (grad, then clip_by_global_norm), then sum.
    one_row: the loss reads the example as a batch of one, x[None], as JAX examples do."""

    def clipped_grad(params, x, y):
        if one_row:
            x, y = x[None], y[None]
        g = dq.grad(lambda p: mlp.loss(*p, x, y))(params)
        return dq.optim.clip_by_global_norm(g, C)

    def step(params, xs, ys):
        per = dq.vmap(clipped_grad, in_axes=(None, 0, 0))(params, xs, ys)
        return dq.tree_map(lambda g: dq.sum(g, axis=0), per)

    return step


def clipped_outside(C):
    """vmap(grad) first, then every example scaled by min(1, C / ||g_i||) and summed."""

    def step(params, xs, ys):
        per = dq.vmap(dq.grad(mlp.loss, argnums=(0, 1, 2, 3)), in_axes=(None,) * 4 + (0, 0))(
            *params, xs, ys
        )
        B = xs.shape[0]
        sq = None
        for g in per:
            part = dq.sum(dq.square(g), axis=tuple(range(1, len(g.shape))))
            sq = part if sq is None else sq + part
        scale = dq.minimum(1.0, C / dq.sqrt(sq))
        return [dq.sum(g * scale.reshape((B,) + (1,) * (len(g.shape) - 1)), axis=0) for g in per]

    return step


def loop_oracle(params, xs, ys, C):
    """float64: each example's gradient by the hand-written backward pass, clipped, summed."""
    p64 = [np.asarray(p, np.float64) for p in params]
    total = [np.zeros_like(p) for p in p64]
    for i in range(xs.shape[0]):
        _, g = mlp.numpy_value_and_grad(*p64, xs[i : i + 1].astype(np.float64), ys[i : i + 1])
        norm = np.sqrt(sum(np.sum(gi * gi) for gi in g))
        scale = min(1.0, C / norm)
        total = [t + scale * gi for t, gi in zip(total, g)]
    return total


def problem(B, sizes, dtype=np.float32):
    params = [
        (p + RNG.standard_normal(p.shape) * 0.1).astype(dtype)
        for p in mlp.init_params(sizes, seed=int(RNG.integers(1 << 30)), dtype=dtype)
    ]
    xs = RNG.standard_normal((B, sizes[0])).astype(dtype)
    ys = np.eye(sizes[-1], dtype=dtype)[RNG.integers(0, sizes[-1], B)]
    return params, xs, ys


def close(got, want, rel=1e-4):
    for g, w in zip(got, want):
        g = np.asarray(g, np.float64)
        np.testing.assert_allclose(g, w, rtol=0, atol=rel * max(np.abs(w).max(), 1e-30))


def optimized(step, params, xs, ys):
    module = dq.make_ir(step)(params, xs, ys)
    result = dq.optimize(module)
    (name,) = module.functions
    fired = result.report.functions[name].saturation.rule_matches
    return module, result.module, name, fired


# ---------------------------------------------------------------- the rules, proved
def test_rule_file_is_proven_by_verify_rules():
    from dlvm_eq.verify.rules import verify_rules

    report = verify_rules([rule_file("per_example.egg")])
    assert len(report.results) == 5
    assert all(r.status == "proven" for r in report.results), [
        (r.where, r.status) for r in report.results if r.status != "proven"
    ]


# ---------------------------------------------------------------- terms in, terms out
DECLS = "".join(
    f'(let ${n} (Var "{n}")) (set (shape ${n}) (vec-of {" ".join(map(str, s))})) '
    f'(set (dtype ${n}) "f32")\n'
    for n, s in {"a": (4, 6), "b": (4, 5), "c": (4,), "a1": (1, 6), "b1": (1, 5)}.items()
)


def outer(a="$a", b="$b", B=4, k=6, n=5, sa=None, sb=None):
    """a (B k) ⊗ b (B n) per example, as vmap writes it: (B k 1) * (B 1 n)."""
    sa = sa or (B, k, 1)
    sb = sb or (B, 1, n)
    v = lambda s: "(vec-of " + " ".join(map(str, s)) + ")"
    full = v((4, k, n))
    return (
        f"(Multiply (Broadcast (ShapeCast {a} {v(sa)}) {full}) "
        f"(Broadcast (ShapeCast {b} {v(sb)}) {full}))"
    )


def sq_norm(p):
    return f'(Reduce (Reduce (Square {p}) "add" 0.0 2) "add" 0.0 1)'


C3 = "(Broadcast (ShapeCast $c (vec-of 4 1 1)) (vec-of 4 6 5))"
CB = "(Broadcast (ShapeCast $c (vec-of 4 1)) (vec-of 4 5))"
GEMM = f"(Dot (Transpose $a (vec-of 1 0)) (Multiply $b {CB}))"

FIRES = [
    (
        "per-example-sq-norm",
        sq_norm(outer()),
        '(Multiply (Reduce (Square $a) "add" 0.0 1) (Reduce (Square $b) "add" 0.0 1))',
    ),
    ("per-example-scaled-sum", f'(Reduce (Multiply {outer()} {C3}) "add" 0.0 0)', GEMM),
    ("per-example-scaled-sum'", f'(Reduce (Multiply {C3} {outer()}) "add" 0.0 0)', GEMM),
    ("per-example-sum", f'(Reduce {outer()} "add" 0.0 0)', "(Dot (Transpose $a (vec-of 1 0)) $b)"),
    # the loss read x[None]: the column is a (B 1 k) row transposed, a reshape
    (
        "per-example-T-is-reshape",
        "(Reduce (Multiply (Broadcast (Transpose (ShapeCast $a (vec-of 4 1 6)) (vec-of 0 2 1)) "
        '(vec-of 4 6 5)) (Broadcast (ShapeCast $b (vec-of 4 1 5)) (vec-of 4 6 5))) "add" 0.0 0)',
        "(Dot (Transpose $a (vec-of 1 0)) $b)",
    ),
]


def fired(term: str, expected: str) -> bool:
    with scratch_session() as s:
        s.run_text(DECLS + f"(let $t {term})\n(let $e {expected})")
        # identities: the ShapeCasts of the right-hand sides cancel the ones that made a and b
        saturate(s, Schedule(("perexample", "identities")), Budget(iterations=4))
        try:
            s.run_text("(check (= $t $e))")
            return True
        except RuleFileError:
            return False


@pytest.mark.parametrize("name,term,expected", FIRES, ids=[f[0] for f in FIRES])
def test_rule_fires(name, term, expected):
    assert fired(term, expected)


# one example broadcast to a batch of 4 is not 4 examples: a sum over the batch is 4 times its
# outer product, not a1ᵀ b1; a product whose second operand is a column, not a row, is not an
# outer product of rows; a sum over an example's axis is not a sum over the batch
NOT_FIRES = [
    (
        "broadcast batch",
        f'(Reduce {outer("$a1", "$b1", sa=(1, 6, 1), sb=(1, 1, 5))} "add" 0.0 0)',
        "(Dot (Transpose $a1 (vec-of 1 0)) $b1)",
    ),
    (
        "norm of a broadcast batch",
        sq_norm(outer("$a1", "$b1", sa=(1, 6, 1), sb=(1, 1, 5))),
        '(Multiply (Reduce (Square $a1) "add" 0.0 1) (Reduce (Square $b1) "add" 0.0 1))',
    ),
    (
        "sum over an example's axis",
        f'(Reduce (Reduce {outer()} "add" 0.0 2) "add" 0.0 1)',
        '(Multiply (Reduce $a "add" 0.0 1) (Reduce $b "add" 0.0 1))',
    ),
]


NOT_FIRES.append(
    (
        "a transpose that moves elements",
        "(Transpose (ShapeCast $a (vec-of 4 2 3)) (vec-of 0 2 1))",
        "(ShapeCast $a (vec-of 4 3 2))",
    )
)


@pytest.mark.parametrize("name,term,expected", NOT_FIRES, ids=[f[0] for f in NOT_FIRES])
def test_rule_does_not_fire(name, term, expected):
    assert not fired(term, expected)


# ---------------------------------------------------------------- the traced step
@settings(
    deadline=None,
    derandomize=True,
    max_examples=15,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    B=st.integers(2, 6),
    k=st.integers(2, 7),
    h=st.integers(2, 6),
    n=st.integers(2, 4),
    C=st.sampled_from([2.0**-10, 2.0**-4, 0.375, 1.0, 128.0]),  # exact in f32
    form=st.sampled_from(["inside", "inside x[None]", "outside"]),
)
def test_optimized_step_equals_the_loop(B, k, h, n, C, form):
    """The rules fire on the traced step, and the optimized program (run by the reference
    interpreter in float64) is the clipped sum of the per-example gradients."""
    params, xs, ys = problem(B, [k, h, n])
    step = {
        "inside": clipped_inside(C),
        "inside x[None]": clipped_inside(C, one_row=True),
        "outside": clipped_outside(C),
    }[form]
    _, after, name, matches = optimized(step, params, xs, ys)
    assert all(matches.get(r, 0) + matches.get(r + "'", 0) >= 1 for r in RULES[:2]), matches
    got = interpret(after, name, *params, xs, ys, float64=True)
    close(got, loop_oracle(params, xs, ys, C), rel=1e-9)


@pytest.mark.parametrize("one_row", [False, True], ids=["x", "x[None]"])
def test_per_example_gradients_are_never_stored(one_row):
    """At a shape where they matter, the extracted step has no (B, k, h) or (B, h, n) value."""
    B, sizes = 64, [96, 48, 10]
    params, xs, ys = problem(B, sizes)
    before, after, name, _ = optimized(clipped_inside(0.5, one_row), params, xs, ys)
    big = {(B, sizes[0], sizes[1]), (B, sizes[1], sizes[2])}

    def shapes(fn):
        return {inst.result.type.shape for inst in fn.body if hasattr(inst.result.type, "shape")}

    assert big <= shapes(before[name])  # the traced step writes them
    assert not big & shapes(after[name])
    got = interpret(after, name, *params, xs, ys, float64=True)
    close(got, loop_oracle(params, xs, ys, 0.5), rel=1e-9)


@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_step_on_targets_with_noise(target):
    """The jitted DP-SGD step with Gaussian noise from dq.random equals the float64 loop plus
    the same noise, on interp (the traced program) and cpu (the optimized one)."""
    B, sizes, C, sigma = 24, [20, 12, 5], 0.25, 0.75
    params, xs, ys = problem(B, sizes)
    step = clipped_inside(C)

    def noisy(params, xs, ys, key):
        keys = dq.random.split(key, len(params))
        return [
            g + sigma * C * dq.random.normal(k, g.shape) for g, k in zip(step(params, xs, ys), keys)
        ]

    key = dq.random.key(7)
    got = dq.jit(noisy, target=target)(params, xs, ys, key)
    noise = [
        sigma * C * np.asarray(dq.random.normal(k, p.shape), np.float64)
        for p, k in zip(params, dq.random.split(key, len(params)))
    ]
    want = [w + z for w, z in zip(loop_oracle(params, xs, ys, C), noise)]
    close(got, want, rel=1e-4)


# ---------------------------------------------------------------- where they must not fire
def test_returned_per_example_gradients_are_left_alone():
    B, sizes = 5, [6, 4, 3]
    params, xs, ys = problem(B, sizes)

    def per_example(params, xs, ys):
        return dq.vmap(dq.grad(lambda p, x, y: mlp.loss(*p, x, y)), in_axes=(None, 0, 0))(
            params, xs, ys
        )

    _, after, name, matches = optimized(per_example, params, xs, ys)
    assert not [r for r in matches if r.startswith("per-example")], matches
    got = interpret(after, name, *params, xs, ys, float64=True)
    p64 = [np.asarray(p, np.float64) for p in params]
    for i in range(B):
        _, want = mlp.numpy_value_and_grad(*p64, xs[i : i + 1], ys[i : i + 1])
        close([g[i] for g in got], want, rel=1e-9)


def test_non_rank_one_per_example_products_are_left_alone():
    """A sequence per example: its weight gradient x_iᵀ δ_i contracts T = 3 positions (a
    batchMatmul), not an outer product; the rules do not apply, and the step is still right."""
    B, T, k, n, C = 4, 3, 5, 2, 0.125
    w = RNG.standard_normal((k, n)).astype(np.float32)
    xs = RNG.standard_normal((B, T, k)).astype(np.float32)
    ys = RNG.standard_normal((B, T, n)).astype(np.float32)

    def loss(w, x, y):
        return dq.mean(dq.square(x @ w - y))

    def step(w, xs, ys):
        g = dq.vmap(dq.grad(loss), in_axes=(None, 0, 0))(w, xs, ys)
        scale = dq.minimum(1.0, C / dq.sqrt(dq.sum(dq.square(g), axis=(1, 2))))
        return dq.sum(g * scale.reshape(B, 1, 1), axis=0)

    module = dq.make_ir(step)(w, xs, ys)
    result = dq.optimize(module)
    matches = result.report.functions["step"].saturation.rule_matches
    assert not [r for r in matches if r.startswith("per-example")], matches
    want = np.zeros((k, n))
    for i in range(B):
        x, y = xs[i].astype(np.float64), ys[i].astype(np.float64)
        g = x.T @ (2.0 * (x @ w - y) / (T * n))
        want += min(1.0, C / np.sqrt(np.sum(g * g))) * g
    close([interpret(result.module, "step", w, xs, ys, float64=True)], [want], rel=1e-9)
