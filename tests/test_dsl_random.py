"""Random DSL expressions (hypothesis): traced + interpreted, and eager, agree with numpy.

An expression is a tree over three inputs whose shapes broadcast to (3, 4). Every op is
continuous and kept in a safe domain (exp of tanh, log1p of abs, division by 1 + b^2), so that
float64 results must agree to rounding whatever tree hypothesis builds.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

import dlvm_eq as dq

FULL = (3, 4)
LEAF_SHAPES = [(3, 4), (4,), (3, 1), (), (1, 4)]

UNARY = {  # name -> (DSL, numpy)
    "tanh": (dq.tanh, np.tanh),
    "sigmoid": (dq.sigmoid, special.expit),
    "sin": (dq.sin, np.sin),
    "cos": (dq.cos, np.cos),
    "neg": (lambda x: -x, np.negative),
    "abs": (dq.abs, np.abs),
    "relu": (dq.relu, lambda x: np.maximum(x, 0)),
    "square": (dq.square, np.square),
    "softplus": (dq.softplus, lambda x: np.logaddexp(0, x)),
    "exp_tanh": (lambda x: dq.exp(dq.tanh(x)), lambda x: np.exp(np.tanh(x))),
    "log1p_abs": (lambda x: dq.log1p(abs(x)), lambda x: np.log1p(np.abs(x))),
    "sqrt_1_sq": (lambda x: dq.sqrt(1.0 + x * x), lambda x: np.sqrt(1 + x * x)),
    "pow3": (lambda x: x**3, lambda x: x**3),
}
BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / (1.0 + b * b), lambda a, b: a / (1 + b * b)),
    "rdiv": (lambda a, b: 2.0 / (1.5 + dq.tanh(b)) - a, lambda a, b: 2 / (1.5 + np.tanh(b)) - a),
    "maximum": (dq.maximum, np.maximum),
    "minimum": (dq.minimum, np.minimum),
    "where": (lambda a, b: dq.where(a > b, a, b), lambda a, b: np.where(a > b, a, b)),
}
REDUCE = {
    "sum": (dq.sum, np.sum),
    "mean": (dq.mean, np.mean),
    "max": (dq.max, np.max),
    "min": (dq.min, np.min),
    "logsumexp": (
        dq.logsumexp,
        lambda x, axis, keepdims: special.logsumexp(x, axis, keepdims=keepdims),
    ),
}
AXIS_OPS = {  # shape-preserving ops along an axis
    "softmax": (dq.softmax, special.softmax),
    "log_softmax": (dq.log_softmax, special.log_softmax),
}


@st.composite
def expressions(draw, depth=4):
    """Trees: ("var", i), ("const", c), ("unary", op, a), ("binary", op, a, b), and
    ("reduce"|"axis", op, a, seed) whose axes `resolve` picks once shapes are known."""
    if depth == 0 or draw(st.integers(0, 4)) == 0:
        if draw(st.integers(0, 5)) == 0:
            return ("const", round(draw(st.floats(-2, 2, allow_nan=False)), 3))
        return ("var", draw(st.integers(0, 2)))
    kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "axis"]))
    a = draw(expressions(depth - 1))
    if kind == "binary":
        return ("binary", draw(st.sampled_from(sorted(BINARY))), a, draw(expressions(depth - 1)))
    if kind == "unary":
        return ("unary", draw(st.sampled_from(sorted(UNARY))), a)
    name = draw(st.sampled_from(sorted(REDUCE if kind == "reduce" else AXIS_OPS)))
    return (kind, name, a, draw(st.integers(0, 10**6)))


def broadcasts_to_full(shape) -> bool:
    try:
        return np.broadcast_shapes(shape, FULL) == FULL
    except ValueError:
        return False


def resolve(tree, leaf_shapes):
    """Fix axis options now that shapes are known; returns (tree, shape)."""
    tag = tree[0]
    if tag == "var":
        return tree, leaf_shapes[tree[1]]
    if tag == "const":
        return tree, ()
    if tag == "unary":
        a, s = resolve(tree[2], leaf_shapes)
        return ("unary", tree[1], a), s
    if tag == "binary":
        a, sa = resolve(tree[2], leaf_shapes)
        b, sb = resolve(tree[3], leaf_shapes)
        return ("binary", tree[1], a, b), np.broadcast_shapes(sa, sb)
    a, s = resolve(tree[2], leaf_shapes)
    seed = tree[3]
    rank = len(s)
    if rank == 0:
        return a, s
    if tag == "axis":
        axis = seed % rank - (rank if seed % 2 else 0)  # negative axes too
        return ("axis", tree[1], a, axis), s
    choices = [None] + list(range(rank)) + list(range(-rank, 0)) + ([(0, -1)] if rank == 2 else [])
    axis = choices[seed % len(choices)]
    reduced = np.sum(np.zeros(s), axis=axis).shape
    keepdims = bool(seed // 7 % 2)
    if not keepdims and not broadcasts_to_full(reduced):
        keepdims = True  # stay broadcastable with the other inputs
    out = np.sum(np.zeros(s), axis=axis, keepdims=keepdims).shape
    return ("reduce", tree[1], a, axis, keepdims), out


def evaluate(tree, env, lib: int):
    """lib 0: the DSL, lib 1: numpy."""
    tag = tree[0]
    if tag == "var":
        return env[tree[1]]
    if tag == "const":
        return tree[1]
    a = evaluate(tree[2], env, lib)
    if tag == "unary":
        return UNARY[tree[1]][lib](a)
    if tag == "binary":
        return BINARY[tree[1]][lib](a, evaluate(tree[3], env, lib))
    if tag == "axis":
        return AXIS_OPS[tree[1]][lib](a, axis=tree[3])
    return REDUCE[tree[1]][lib](a, axis=tree[3], keepdims=tree[4])


@settings(max_examples=300, deadline=None)
@given(
    expressions(),
    st.lists(st.sampled_from(LEAF_SHAPES), min_size=3, max_size=3),
    st.integers(0, 2**32 - 1),
)
def test_random_expressions_match_numpy(raw, leaf_shapes, seed):
    tree, shape = resolve(raw, leaf_shapes)
    rng = np.random.default_rng(seed)
    inputs = [rng.uniform(-2, 2, s) for s in leaf_shapes]

    def fn(x, y, z):
        return evaluate(tree, (x, y, z), 0) + 0.0 * x  # depends on x: a traced result

    def ref(x, y, z):
        return evaluate(tree, (x, y, z), 1) + 0.0 * x

    expected = ref(*inputs)
    module = dq.make_ir(fn)(*inputs)
    out = dq.interpret(module, "fn", *inputs)
    assert out.shape == expected.shape and out.dtype == np.float64
    np.testing.assert_allclose(out, expected, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(fn(*inputs), expected, rtol=1e-9, atol=1e-9)  # eager
    text = str(module)
    assert str(dq.parse(text)) == text  # traced programs print as DLVM IR that reparses
    f32 = [a.astype(np.float32) for a in inputs]
    assert dq.interpret(dq.make_ir(fn)(*f32), "fn", *f32).dtype == np.float32
