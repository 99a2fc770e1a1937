"""rules/adjoint.egg, op by op: every differentiable op of the op table has a case here, checked
against float64 central differences (first order, and second order by differentiating the
adjoint program again) over random shapes with broadcasting. Plus: the rule file covers every
(op, differentiable operand), and a missing rule is an error that names the op and operand.

`fd_check` is shared with the other adjoint tests (`from test_adjoint_rules import fd_check`).
"""

from __future__ import annotations

import re
import zlib
from itertools import permutations

import numpy as np
import pytest
from window_cases import case_window

from dlvm_eq.ad import AdjointError, adjoint_function
from dlvm_eq.egraph.rulefiles import rule_file
from dlvm_eq.ir import F32, F64, FunctionBuilder, Module, tensor
from dlvm_eq.ir.interp import run_function
from dlvm_eq.ir.ops import BINARY, BIT_OPS, COMPARE, CONTROL, LOGIC, OPS, UNARY
from dlvm_eq.ir.types import BOOL, DType, TupleType
from dlvm_eq.ir.window_ops import WINDOW_OPS

# issue 33: the fused attention's adjoints live beside it, in their own file
RULES = rule_file("adjoint.egg").read_text() + rule_file("attention_adjoint.egg").read_text()


# ---------------------------------------------------------------- the finite-difference check


def _outputs(x):
    return x if isinstance(x, tuple) else (x,)


def fd_check(fn, args, module=None, wrt=None, rng=None, eps=1e-6, rtol=1e-6, **adjoint_kw):
    """Central differences of <seed, fn(args + t·d)> along a random direction d against
    <adjoint(seed), d>, in float64. Returns the seedable adjoint Function."""
    rng = rng or np.random.default_rng(0)
    adj = adjoint_function(module, fn, wrt=wrt, seedable=True, tuple_result=True, **adjoint_kw)
    wrt = wrt if wrt is not None else [i for i, p in enumerate(fn.params) if p.type.dtype.is_float]
    args = [
        np.asarray(a, np.float64) if fn.params[i].type.dtype.is_float else np.asarray(a)
        for i, a in enumerate(args)
    ]
    outs = [
        o
        for o in _outputs(run_function(module, fn, args, float64=True))
        if np.issubdtype(np.asarray(o).dtype, np.floating)
    ]
    seeds = [rng.standard_normal(np.shape(o)) for o in outs]
    dirs = {i: rng.standard_normal(np.shape(args[i])) for i in wrt}

    def along(t):
        moved = [a + t * dirs[i] if i in dirs else a for i, a in enumerate(args)]
        o = [
            v
            for v in _outputs(run_function(module, fn, moved, float64=True))
            if np.issubdtype(np.asarray(v).dtype, np.floating)
        ]
        return sum(float(np.sum(s * np.asarray(v, np.float64))) for s, v in zip(seeds, o))

    fd = (along(eps) - along(-eps)) / (2 * eps)
    grads = _outputs(run_function(None, adj, args + seeds, float64=True))
    assert len(grads) == len(wrt)
    for g, i in zip(grads, wrt):
        assert np.shape(g) == np.shape(args[i]), f"gradient {i} has shape {np.shape(g)}"
    exact = sum(float(np.sum(g * dirs[i])) for g, i in zip(grads, wrt))
    scale = 1.0 + abs(fd) + sum(float(np.sum(np.abs(g * dirs[i]))) for g, i in zip(grads, wrt))
    assert abs(fd - exact) <= rtol * scale, (
        f"@{fn.name}: finite differences {fd} vs adjoint {exact}\n{adj}"
    )
    return adj


def fd_check2(fn, args, rng, module=None):
    """First and second order: the adjoint program is differentiated again (grad of grad)."""
    adj = fd_check(fn, args, module=module, rng=rng)
    seeds = [
        rng.standard_normal(t.shape)
        for t in (
            fn.result_type.elements if isinstance(fn.result_type, TupleType) else (fn.result_type,)
        )
        if t.dtype.is_float
    ]
    fd_check(adj, list(args) + seeds, rng=rng, rtol=1e-5)


# ---------------------------------------------------------------- random cases per op

POSITIVE = {"log", "sqrt", "rsqrt", "log1p", "power"}


def _values(rng, shape, positive=False):
    mag = rng.uniform(0.5, 1.5, shape)
    return mag if positive else mag * rng.choice([-1.0, 1.0], shape)


def _shape(rng, min_rank=0, max_rank=3):
    return tuple(int(d) for d in rng.integers(1, 5, rng.integers(min_rank, max_rank + 1)))


def _partner(rng, shape):
    """A shape broadcasting with `shape`: some dims 1, a suffix, or scalar."""
    how = rng.integers(0, 4)
    if how == 0:
        return shape
    if how == 1:
        return tuple(1 if rng.random() < 0.5 else d for d in shape)
    if how == 2:
        return shape[rng.integers(0, len(shape) + 1) :]
    return ()


def _fn(types, body, name="f"):
    b = FunctionBuilder(name, types, [f"x{i}" for i in range(len(types))])
    return b.finish(body(b, *b.params))


def case_unary(op, rng):
    s = _shape(rng)
    return _fn([tensor(*s, F64)], lambda b, x: b.emit(op, [x])), [_values(rng, s, op in POSITIVE)]


def case_binary(op, rng):
    s1 = _shape(rng)
    s2 = _partner(rng, s1)
    if rng.random() < 0.5:
        s1, s2 = s2, s1
    pos = op in POSITIVE or op == "divide"
    return (
        _fn([tensor(*s1, F64), tensor(*s2, F64)], lambda b, x, y: b.emit(op, [x, y])),
        [_values(rng, s1, op in POSITIVE), _values(rng, s2, pos)],
    )


def case_select(op, rng):
    s = _shape(rng, 1)
    s2, s3 = _partner(rng, s), _partner(rng, s)
    fn = _fn(
        [tensor(*s, F64), tensor(*s2, F64), tensor(*s3, F64)],
        lambda b, x, y, z: b.emit("select", [x, y, b.emit("greaterThan", [z, b.const(0.0, F64)])]),
    )
    return fn, [_values(rng, s), _values(rng, s2), _values(rng, s3)]


def case_nondiff(op, rng):
    """compare / logic ops: their result only selects, so no adjoint flows through them."""
    s = _shape(rng, 1)

    def body(b, x, y):
        m = b.emit(op, [x, y]) if OPS[op].kind == COMPARE else None
        if m is None:
            p, q = (
                b.emit("greaterThan", [x, b.const(0.0, F64)]),
                b.emit("lessThan", [y, b.const(0.0, F64)]),
            )
            m = b.emit(op, [p] if OPS[op].arity == 1 else [p, q])
        return b.emit("select", [b.emit("exp", [x]), y, m])

    return _fn([tensor(*s, F64), tensor(*s, F64)], body), [_values(rng, s), _values(rng, s)]


def case_dot(op, rng):
    m, k, n = (int(d) for d in rng.integers(1, 5, 3))
    sa, sb = [((m, k), (k, n)), ((k,), (k, n)), ((m, k), (k,)), ((k,), (k,))][rng.integers(0, 4)]
    return (
        _fn([tensor(*sa, F64), tensor(*sb, F64)], lambda b, x, y: b.emit("dot", [x, y])),
        [_values(rng, sa), _values(rng, sb)],
    )


def case_transpose(op, rng):
    s = _shape(rng, 1, 4)
    perm = list(permutations(range(len(s))))[rng.integers(0, np.prod(range(1, len(s) + 1)))]
    return _fn([tensor(*s, F64)], lambda b, x: b.emit("transpose", [x], perm=perm)), [
        _values(rng, s)
    ]


def case_reduce(op, rng):
    s = _shape(rng, 1)
    axes = tuple(sorted(set(int(a) for a in rng.integers(0, len(s), rng.integers(0, len(s) + 1)))))
    comb = ["add", "multiply", "max", "min"][rng.integers(0, 4)]
    init = {"add": 0.5, "multiply": 1.5, "max": -np.inf, "min": np.inf}[comb]
    fn = _fn(
        [tensor(*s, F64)], lambda b, x: b.emit("reduce", [x], combinator=comb, init=init, axes=axes)
    )
    return fn, [_values(rng, s)]


def case_shape_cast(op, rng):
    s = _shape(rng, 1)
    size = int(np.prod(s))
    t = (size,) if rng.random() < 0.5 else (1, size, 1)
    return _fn([tensor(*s, F64)], lambda b, x: b.emit("shapeCast", [x], shape=t)), [_values(rng, s)]


def case_pad_shape(op, rng):
    s = _shape(rng)
    at = int(rng.integers(0, len(s) + 1))
    return _fn([tensor(*s, F64)], lambda b, x: b.emit("padShape", [x], at=at)), [_values(rng, s)]


def case_squeeze_shape(op, rng):
    s = list(_shape(rng))
    at = int(rng.integers(0, len(s) + 1))
    s.insert(at, 1)
    return _fn([tensor(*s, F64)], lambda b, x: b.emit("squeezeShape", [x], at=at)), [
        _values(rng, s)
    ]


def case_broadcast(op, rng):
    t = _shape(rng, 1)
    s = _partner(rng, t)
    return _fn([tensor(*s, F64)], lambda b, x: b.emit("broadcast", [x], shape=t)), [_values(rng, s)]


def case_cast(op, rng):
    s = _shape(rng)
    fn = _fn(
        [tensor(*s, F64)],
        lambda b, x: b.emit(
            "dataTypeCast",
            [b.emit("sin", [b.emit("dataTypeCast", [x], dtype=DType.f32)])],
            dtype=DType.f64,
        ),
    )
    return fn, [_values(rng, s)]


def case_concatenate(op, rng):
    s = list(_shape(rng, 1))
    axis = int(rng.integers(0, len(s)))
    shapes = []
    for _ in range(int(rng.integers(2, 4))):
        s[axis] = int(rng.integers(1, 6))
        shapes.append(tuple(s))
    fn = _fn(
        [tensor(*x, F64) for x in shapes], lambda b, *xs: b.emit("concatenate", list(xs), axis=axis)
    )
    return fn, [_values(rng, x) for x in shapes]


def case_slice(op, rng):
    s = list(_shape(rng, 1))
    axis = int(rng.integers(0, len(s)))
    s[axis] = int(rng.integers(1, 6))
    lo = int(rng.integers(0, s[axis]))
    hi = int(rng.integers(lo + 1, s[axis] + 1))
    fn = _fn([tensor(*s, F64)], lambda b, x: b.emit("slice", [x], axis=axis, lo=lo, hi=hi))
    return fn, [_values(rng, s)]


def case_call(op, rng):
    """apply, tuple and extract: a callee returning a tuple, inlined by the loader."""
    s = _shape(rng)
    m = Module("m")
    g = _fn(
        [tensor(*s, F64), tensor(*s, F64)],
        lambda b, x, y: b.emit("tuple", [b.emit("multiply", [x, y]), b.emit("sin", [x])]),
        name="g",
    )
    m.add(g)

    def body(b, x, y):
        t = b.emit("apply", [x, y], callee="g", type=g.result_type)
        return b.emit("add", [b.emit("extract", [t], index=0), b.emit("extract", [t], index=1)])

    m.add(_fn([tensor(*s, F64), tensor(*s, F64)], body))
    return m["f"], [_values(rng, s), _values(rng, s)], m


CASES = {
    # stopGradient's zero adjoint is its definition, not a derivative finite differences see
    # (tests/test_transforms.py checks it)
    **{op: case_unary for op in OPS if OPS[op].kind == UNARY and op != "stopGradient"},
    **{op: case_binary for op in OPS if OPS[op].kind == BINARY and op not in BIT_OPS},
    **{op: case_nondiff for op in OPS if OPS[op].kind in (COMPARE, LOGIC)},
    "select": case_select,
    "dot": case_dot,
    "transpose": case_transpose,
    "reduce": case_reduce,
    "shapeCast": case_shape_cast,
    "padShape": case_pad_shape,
    "squeezeShape": case_squeeze_shape,
    "broadcast": case_broadcast,
    "dataTypeCast": case_cast,
    "concatenate": case_concatenate,
    "slice": case_slice,
    "apply": case_call,
    "tuple": case_call,
    "extract": case_call,
    **{op: case_window for op in WINDOW_OPS},
}


# ---- issue 14 part B (batched matmul, take, scatterAdd): own block
def case_batch_matmul(op, rng):
    batch = _shape(rng, 1, 2)
    m, k, n = (int(d) for d in rng.integers(1, 4, 3))
    sa, sb = batch + (m, k), batch + (k, n)
    return (
        _fn([tensor(*sa, F64), tensor(*sb, F64)], lambda b, x, y: b.emit("batchMatmul", [x, y])),
        [_values(rng, sa), _values(rng, sb)],
    )


def case_gather(op, rng):
    """take or scatterAdd along a random axis, with repeated indices (they accumulate)."""
    s = list(_shape(rng, 1))
    axis = int(rng.integers(0, len(s)))
    size = int(rng.integers(1, 5))
    ids = rng.integers(0, size, int(rng.integers(1, 7))).astype(np.int32)
    if op == "take":
        s[axis] = size
        body = lambda b, x, i: b.emit("take", [x, i], axis=axis)
    else:
        s[axis] = len(ids)
        body = lambda b, x, i: b.emit("scatterAdd", [x, i], axis=axis, size=size)
    return _fn([tensor(*s, F64), tensor(len(ids), DType.i32)], body), [_values(rng, s), ids]


def case_strided(op, rng):
    """slice with a step > 1, or its adjoint sliceScatter."""
    s = list(_shape(rng, 1))
    axis = int(rng.integers(0, len(s)))
    step, m = int(rng.integers(2, 4)), int(rng.integers(1, 4))
    lo = int(rng.integers(0, 3))
    n = lo + (m - 1) * step + 1 + int(rng.integers(0, 3))
    if op == "sliceScatter":
        s[axis] = m
        body = lambda b, x: b.emit("sliceScatter", [x], axis=axis, lo=lo, step=step, size=n)
    else:
        s[axis] = n
        body = lambda b, x: b.emit("slice", [x], axis=axis, lo=lo, hi=n, step=step)
    return _fn([tensor(*s, F64)], body), [_values(rng, s)]


def case_cumsum(op, rng):
    s = _shape(rng, 1)
    axis, reverse = int(rng.integers(0, len(s))), bool(rng.integers(0, 2))
    return _fn([tensor(*s, F64)], lambda b, x: b.emit("cumsum", [x], axis=axis, reverse=reverse)), [
        _values(rng, s)
    ]


# ---- issue 33: the fused attention (rules/attention_adjoint.egg); the bias is a mask constant
def case_attention(op, rng):  # rank 3: the rank the adjoint rules cover
    batch = _shape(rng, 1, 1)
    m, n, d, e = (int(x) for x in rng.integers(1, 4, 4))
    sq, sk, sv = batch + (m, d), batch + (n, d), batch + (n, e)
    scale = float(rng.choice([1.0, 0.5]))
    body = lambda b, q, k, v: b.emit(
        "attention", [q, k, v, b.const(0.0, F64)], scale=scale, causal=0
    )
    shapes = (sq, sk, sv)
    return _fn([tensor(*s, F64) for s in shapes], body), [_values(rng, s) for s in shapes]


CASES["attention"] = case_attention
# ---- end of issue 33

CASES.update(
    {
        "cumsum": case_cumsum,
        "batchMatmul": case_batch_matmul,
        "take": case_gather,
        "scatterAdd": case_gather,
        "sliceScatter": case_strided,
        "strided slice": case_strided,
    }
)


def test_every_differentiable_op_has_a_case():
    # control flow is differentiated by ad/control_flow.py (tests/test_control_flow_grad.py)
    missing = [
        op
        for op, spec in OPS.items()
        if spec.differentiable and spec.kind != CONTROL and op not in CASES
    ]
    assert not missing, f"differentiable ops without an adjoint test: {missing}"


@pytest.mark.parametrize("op", sorted(CASES))
def test_op_adjoint_matches_finite_differences(op):
    rng = np.random.default_rng(zlib.crc32(op.encode()))
    for trial in range(
        4
        if op
        in (
            "reduce",
            "transpose",
            "dot",
            "concatenate",
            "slice",
            "broadcast",
            "take",
            "scatterAdd",
            "strided slice",
            "sliceScatter",
        )
        + WINDOW_OPS
        else 2
    ):
        case = CASES[op](op, rng)
        fn, args, module = case if len(case) == 3 else (*case, None)
        if trial == 0:
            fd_check2(fn, args, rng, module)  # grad of grad: the adjoint's ops have rules too
        else:
            fd_check(fn, args, module=module, rng=rng)


def test_piecewise_constant_ops_have_zero_adjoints():
    for op in ("sign", "floor", "ceil", "round"):
        fn = _fn([tensor(3, F64)], lambda b, x: b.emit("multiply", [b.emit(op, [x]), x]))
        adj = adjoint_function(None, fn, tuple_result=True)
        x = np.array([0.3, -1.7, 2.2])
        (g,) = run_function(None, adj, [x], float64=True)
        np.testing.assert_allclose(g, OPS[op].evaluate([x], {}))  # d(op(x)·x) = op(x)


# ---------------------------------------------------------------- ties, as JAX picks them


def test_max_min_split_ties_equally():
    fn = _fn([tensor(3, F64), tensor(3, F64)], lambda b, x, y: b.emit("max", [x, y]))
    adj = adjoint_function(None, fn, tuple_result=True)
    gx, gy = run_function(None, adj, [np.array([1.0, 2.0, 3.0]), np.array([1.0, 5.0, 0.0])])
    np.testing.assert_array_equal(gx, [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(gy, [0.5, 1.0, 0.0])
    fn = _fn(
        [tensor(4, F64)],
        lambda b, x: b.emit("reduce", [x], combinator="max", init=-np.inf, axes=(0,)),
    )
    (g,) = run_function(
        None, adjoint_function(None, fn, tuple_result=True), [np.array([3.0, 1.0, 3.0, 2.0])]
    )
    np.testing.assert_array_equal(g, [0.5, 0.0, 0.5, 0.0])
    fn = _fn([tensor(3, F64)], lambda b, x: b.emit("relu", [x]))
    (g,) = run_function(
        None, adjoint_function(None, fn, tuple_result=True), [np.array([-1.0, 0.0, 2.0])]
    )
    np.testing.assert_array_equal(g, [0.0, 0.0, 1.0])


# ---------------------------------------------------------------- the rule file itself


def _rule_heads():
    return set(re.findall(r"\(Adjoint (\d+) \((\w+)", RULES))


def test_rule_file_covers_every_differentiable_operand():
    heads = _rule_heads()
    egg_ops = {spec.egg for spec in OPS.values()} | {"StridedSlice"}  # the IR's slice with a step
    schema_binary = {"Concatenate": 2}  # variadic in the IR, binary in the e-graph
    missing = []
    for op, spec in OPS.items():
        if not spec.differentiable or spec.kind in ("tuple", "call", "literal", CONTROL):
            continue
        arity = schema_binary.get(spec.egg, spec.arity)
        for i in range(arity):
            if i not in spec.nondiff_operands and (str(i), spec.egg) not in heads:
                missing.append(f"{op} operand {i}")
    assert not missing, f"no rule in adjoint.egg for: {missing}"
    assert {e for _, e in heads} <= egg_ops, "a rule for a constructor the schema does not have"


def test_rules_of_nondifferentiable_operands_do_not_exist():
    heads = _rule_heads()
    for op, spec in OPS.items():
        for i in spec.nondiff_operands if spec.differentiable else range(spec.arity or 0):
            assert (str(i), spec.egg) not in heads, (
                f"{op} operand {i} is declared non-differentiable"
            )


@pytest.mark.parametrize("egg,operand,op", [("Exp", 0, "exp"), ("Power", 1, "power")])
def test_missing_rule_is_an_error_naming_op_and_operand(egg, operand, op):
    lines = [ln for ln in RULES.splitlines() if f"(Adjoint {operand} ({egg} " not in ln]
    assert len(lines) == len(RULES.splitlines()) - 1
    fn = _fn(
        [tensor(3, F32), tensor(3, F32)],
        lambda b, x, y: b.emit("multiply", [b.emit("exp", [x]), b.emit("power", [x, y])]),
    )
    with pytest.raises(AdjointError, match=rf"operand {operand} of `{op}` \({egg}\)"):
        adjoint_function(None, fn, rules="\n".join(lines))
    assert adjoint_function(None, fn, rules=RULES) is not None  # the full text works


def test_nondifferentiable_operands_need_no_rule():
    # the mask of select and int / bool operands are never asked for
    fn = _fn(
        [tensor(3, F32), tensor(3, BOOL)],
        lambda b, x, m: b.emit("select", [x, b.const(0.0, F32), m]),
    )
    adj = adjoint_function(None, fn, tuple_result=True)
    (g,) = run_function(None, adj, [np.ones(3, np.float32), np.array([True, False, True])])
    np.testing.assert_array_equal(g, [1.0, 0.0, 1.0])


# ---------------------------------------------------------------- sympy, when dlvm_eq.verify has it


@pytest.mark.parametrize("op", sorted(CASES))
def test_op_adjoint_against_sympy(op):
    verify = pytest.importorskip("dlvm_eq.verify")
    if not hasattr(verify, "verify_adjoint"):
        pytest.skip("dlvm_eq.verify.verify_adjoint is not there yet")
    rng = np.random.default_rng(zlib.crc32(op.encode()) + 1)
    for _ in range(50):  # small shapes keep sympy quick
        case = CASES[op](op, rng)
        fn, args, module = case if len(case) == 3 else (*case, None)
        if sum(np.size(a) for a in args) <= 12:
            break
    adj = adjoint_function(module, fn, seedable=True, tuple_result=True)
    fixed = {
        i: a for i, a in enumerate(args) if np.issubdtype(np.asarray(a).dtype, np.integer)
    }  # indices
    report = verify.verify_adjoint(
        fn, adj, module=module, seedable=True, fixed=fixed
    )  # raises if wrong
    assert report.ok, str(report)
