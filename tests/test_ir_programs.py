"""The random program generator (tests/ir_programs.py) makes well-typed, finite, varied programs."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_programs import DEFAULT_KINDS, functions, modules, random_function, random_inputs

from dlvm_eq.ir import F32, F64, I32, OPS, Module, TensorType, TupleType, interpret, verify
from dlvm_eq.ir.ops import BINARY, REDUCE, UNARY

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outputs(fn, args, float64=False):
    m = Module("r")
    m.add(fn)
    out = interpret(m, fn.name, *args, float64=float64)
    return out if isinstance(out, tuple) else (out,)


@FAST
@given(functions(n_ops=20))
def test_programs_are_finite_on_normal_inputs(fn):
    args = random_inputs(fn, np.random.default_rng(0))
    assert [a.shape for a in args] == [p.type.shape for p in fn.params]
    for o in outputs(fn, args):
        if o.dtype.kind == "f":
            assert np.isfinite(o).all()
    # every parameter is used by some instruction
    used = {id(o) for i in fn.body for o in i.operands}
    assert all(id(p) in used for p in fn.params)


@FAST
@given(st.data())
def test_dtypes_kinds_and_sizes(data):
    dtype = data.draw(st.sampled_from([F32, F64, I32]))
    n = data.draw(st.integers(0, 15))
    fn = data.draw(
        functions(n_ops=n, dtype=dtype, kinds=(UNARY, BINARY, REDUCE), name="g", tuple_result=False)
    )
    assert fn.name == "g" and isinstance(fn.result_type, TensorType)
    assert all(p.type.dtype == dtype for p in fn.params)
    assert {OPS[i.op].kind for i in fn.body} <= {UNARY, BINARY, REDUCE}
    if dtype is I32:
        assert not any(OPS[i.op].float_only for i in fn.body)
    outputs(fn, random_inputs(fn, np.random.default_rng(1)))


@FAST
@given(modules(n_ops=8, tuple_result=True))
def test_modules_and_tuple_results(m):
    verify(m)
    fn = m["f"]
    assert isinstance(fn.result_type, TupleType)
    assert len(outputs(fn, random_inputs(fn, np.random.default_rng(2)))) == len(
        fn.result_type.elements
    )


def test_float64_inputs():
    @settings(max_examples=10, deadline=None)
    @given(functions(n_ops=5))
    def run(fn):
        args = random_inputs(fn, np.random.default_rng(0), float64=True)
        assert all(a.dtype == np.float64 for a in args if a.dtype.kind == "f")
        outputs(fn, args, float64=True)

    run()


def test_every_generated_op_kind_and_op_appears():
    seen: set[str] = set()

    @settings(
        max_examples=120,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def collect(data):
        seen.update(i.op for i in data.draw(functions(n_ops=25)).body)

    collect()
    kinds = {OPS[op].kind for op in seen}
    assert set(DEFAULT_KINDS) <= kinds | {"tuple"}
    # the layout and structural ops are all generated, and most elementwise ones
    assert {
        "reduce",
        "dot",
        "transpose",
        "shapeCast",
        "padShape",
        "squeezeShape",
        "broadcast",
        "concatenate",
        "slice",
        "dataTypeCast",
        "literal",
        "select",
        "tuple",
    } <= seen
    elementwise = {n for n, s in OPS.items() if s.kind in ("unary", "binary", "compare", "logic")}
    assert len(elementwise & seen) >= 0.8 * len(elementwise)


def test_random_function_inside_a_composite():
    @st.composite
    def two(draw):
        return random_function(draw, n_ops=3, name="a"), random_function(draw, n_ops=3, name="b")

    @settings(max_examples=5, deadline=None)
    @given(two())
    def run(pair):
        assert [f.name for f in pair] == ["a", "b"]

    run()
