"""print(parse(text)) is a fixed point, on the examples, on DLVM's own spellings and on random
programs; and parsing keeps what the text says (names, types, attributes, values, locations)."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_programs import functions, random_inputs

import dlvm_eq as dq
from dlvm_eq.ir import F32, F64, I32, Const, Module, TensorType, TupleType, interpret, verify

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.dl"))


def roundtrip(text: str, filename: str = "<string>") -> Module:
    m = dq.parse(text, filename)
    verify(m)
    printed = str(m)
    again = dq.parse(printed)
    verify(again)
    assert str(again) == printed
    return m


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"mlp.dl", "logreg.dl", "matrix_chain.dl", "moments.dl"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_round_trip(path):
    m = roundtrip(path.read_text(), str(path))
    assert m.functions
    for fn in m.functions.values():
        assert fn.location is not None and fn.location[0] == str(path)
        assert all(inst.location and inst.location[0] == str(path) for inst in fn.body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(functions(n_ops=12))
def test_random_programs_round_trip(fn):
    m = Module("random")
    m.add(fn)
    printed = str(m)
    parsed = dq.parse(printed)
    assert str(parsed) == printed
    # the parsed program computes the same thing as the one that was printed
    args = random_inputs(fn, np.random.default_rng(0))
    want, got = interpret(m, fn.name, *args), interpret(parsed, fn.name, *args)
    for w, g in zip(
        want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)
    ):
        np.testing.assert_array_equal(w, g)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([F64, I32]).flatmap(lambda dtype: functions(n_ops=10, dtype=dtype, safe=False))
)
def test_random_f64_and_i32_programs_round_trip(fn):
    m = Module("random")
    m.add(fn)
    printed = str(m)
    assert str(dq.parse(printed)) == printed


HEADER = 'module "t"\nstage raw\n\n'


def test_parse_keeps_names_types_and_locations():
    text = (
        HEADER
        + """func @f: (<2 x 3 x f32>, f32) -> <3 x f32> {
'entry(%x: <2 x 3 x f32>, %s: f32):
    %0.0 = multiply %x: <2 x 3 x f32>, %s: f32
    %r = reduce %0.0: <2 x 3 x f32> by max init -inf: f32 along 0
    return %r: <3 x f32>
}
"""
    )
    m = roundtrip(text, "f.dl")
    fn = m["f"]
    assert m.name == "t" and m.stage == "raw"
    assert [p.name for p in fn.params] == ["x", "s"]
    assert fn.param_types == [TensorType((2, 3), F32), TensorType((), F32)]
    assert fn.location == ("f.dl", 4, 1)
    mul, red = fn.body
    assert mul.result.name == "0.0" and mul.op == "multiply" and mul.location == ("f.dl", 6, 5)
    assert mul.operands == [fn.params[0], fn.params[1]]
    assert red.attrs == {"combinator": "max", "init": -np.inf, "axes": (0,)}
    assert red.result.type == TensorType((3,), F32)
    assert fn.ret is red.result


def test_every_special_form_round_trips():
    text = (
        HEADER
        + """func @g: (<2 x 2 x f64>) -> (<2 x 2 x f64>, f64) {
'entry(%a: <2 x 2 x f64>):
    %t = transpose %a: <2 x 2 x f64>
    %s = reduce %t: <2 x 2 x f64> by add init 0.5: f64 along 1, 0
    %r = literal (%t: <2 x 2 x f64>, %s: f64): (<2 x 2 x f64>, f64)
    return %r: (<2 x 2 x f64>, f64)
}

func @f: (<2 x 3 x f32>, <3 x i32>) -> <4 x 3 x f32> {
'entry(%x: <2 x 3 x f32>, %i: <3 x i32>):
    %0 = shapeCast %x: <2 x 3 x f32> to 3 x 2
    %1 = transpose %0: <3 x 2 x f32> along 1, 0
    %2 = padShape %1: <2 x 3 x f32> at 0
    %3 = squeezeShape %2: <1 x 2 x 3 x f32> at 0
    %4 = dataTypeCast %i: <3 x i32> to f32
    %5 = add %3: <2 x 3 x f32>, %4: <3 x f32>
    %6 = literal <<1.5, -2.0, nan>, <inf, -inf, 0.0>>: <2 x 3 x f32>
    %7 = concatenate %5: <2 x 3 x f32>, %6: <2 x 3 x f32> along 0
    %8 = greaterThan %7: <4 x 3 x f32>, 0.0: f32
    %9 = not %8: <4 x 3 x bool>
    %10 = and %9: <4 x 3 x bool>, true: bool
    %11 = select %7: <4 x 3 x f32>, 1e-05: f32 by %10: <4 x 3 x bool>
    %12 = literal 2.0: <2 x 2 x f64>
    %13 = apply @g(%12: <2 x 2 x f64>)
    %14 = extract 1 from %13: (<2 x 2 x f64>, f64)
    %15 = dataTypeCast %14: f64 to f32
    %16 = shapeCast %15: f32 to 1 x 1
    %17 = broadcast %16: <1 x 1 x f32> to 4 x 3
    %18 = multiply %11: <4 x 3 x f32>, %17: <4 x 3 x f32>
    %19 = reduce %18: <4 x 3 x f32> by min init 3: f32
    %20 = add %18: <4 x 3 x f32>, %19: <4 x 3 x f32>
    return %20: <4 x 3 x f32>
}

[adjoint @g from 1 wrt 0 keeping 0, 1 seedable]
func @g_grad: (<2 x 2 x f64>, f64) -> (<2 x 2 x f64>, <2 x 2 x f64>, f64)
"""
    )
    m = roundtrip(text)
    f = m["f"]
    ops = [i.op for i in f.body]
    assert ops[:4] == ["shapeCast", "transpose", "padShape", "squeezeShape"]
    assert f.body[1].attrs == {}  # `along 1, 0` is the default order of a matrix
    assert m["g"].body[0].attrs == {}
    assert m["g"].body[1].attrs["axes"] == (1, 0)
    lit = f.body[6].attrs["value"]
    assert lit.dtype == np.float32 and np.isnan(lit[0, 2]) and lit[1, 1] == -np.inf
    assert f.body[13].attrs == {
        "callee": "g",
        "type": TupleType((TensorType((2, 2), F64), TensorType((), F64))),
    }
    assert f.body[19].attrs["axes"] == () and f.body[19].result.type == TensorType((4, 3), F32)
    decl = m["g_grad"]
    assert decl.is_declaration and decl.ret is None
    assert (
        decl.adjoint.of,
        decl.adjoint.from_index,
        decl.adjoint.wrt,
        decl.adjoint.keeping,
        decl.adjoint.seedable,
    ) == ("g", 1, (0,), (0, 1), True)
    out = interpret(m, "f", np.ones((2, 3), np.float32), np.arange(3, dtype=np.int32))
    assert out.shape == (4, 3)


def test_dlvm_spellings_are_accepted():
    # DLVM's own forms: [gradient ...], apply with a function type, typed array elements,
    # literal operands of tensor type, init given by a literal value, a chain of blocks.
    text = (
        HEADER
        + """func @inference: (<1 x 4 x f32>, <4 x 2 x f32>, <1 x 2 x f32>) -> <1 x 2 x f32> {
'entry(%x: <1 x 4 x f32>, %w: <4 x 2 x f32>, %b: <1 x 2 x f32>):
    %0.0 = dot %x: <1 x 4 x f32>, %w: <4 x 2 x f32>
    %0.1 = add %0.0: <1 x 2 x f32>, %b : <1 x 2 x f32>
    return %0.1: <1 x 2 x f32>
}

func @foo: () -> <1 x 2 x f32> {
'entry():
    %M3 = literal 1: <4 x 2 x f32>
    branch 'bb0(%M3: <4 x 2 x f32>)
'bb0(%w: <4 x 2 x f32>):
    %0.0 = apply @inference(1: <1 x 4 x f32>, %w: <4 x 2 x f32>, 3: <1 x 2 x f32>): (<1 x 4 x f32>, <4 x 2 x f32>, <1 x 2 x f32>) -> <1 x 2 x f32>
    %c = literal <<true: bool, false: bool>: <2 x bool>>: <1 x 2 x bool>
    %z = literal 0: f32
    %s = reduce %0.0: <1 x 2 x f32> by add init %z: f32 along 0
    %r = select %0.0: <1 x 2 x f32>, %s: <2 x f32> by %c: <1 x 2 x bool>
    branch 'bb1()
'bb1():
    return %r: <1 x 2 x f32>
}

[gradient @inference wrt 1, 2 seedable]
func @inference_grad: (<1 x 4 x f32>, <4 x 2 x f32>, <1 x 2 x f32>, <1 x 2 x f32>) -> (<4 x 2 x f32>, <1 x 2 x f32>)
"""
    )
    m = roundtrip(text)
    foo = m["foo"]
    # two literal instructions were made for the tensor-typed operands of apply
    assert [i.op for i in foo.body].count("literal") == 5
    assert foo.body[3].op == "apply" and foo.body[3].operands[1] is foo.body[0].result
    assert foo.body[-2].attrs["init"] == 0.0
    assert "[adjoint @inference wrt 1, 2 seedable]" in str(m)
    np.testing.assert_array_equal(interpret(m, "foo"), [[7.0, 7.0]])  # 1·1·4 + 3


def test_synthesized_literal_names_do_not_clash():
    text = (
        HEADER
        + """func @f: (<2 x f32>) -> <2 x f32> {
'entry(%lit0: <2 x f32>):
    %lit1 = add %lit0: <2 x f32>, 1: <2 x f32>
    return %lit1: <2 x f32>
}
"""
    )
    m = roundtrip(text)
    names = [i.result.name for i in m["f"].body]
    assert len(set(names) | {"lit0"}) == len(names) + 1


def test_scalar_literals_keep_their_values():
    text = (
        HEADER
        + """func @f: (f32) -> f32 {
'entry(%x: f32):
    %0 = add %x: f32, 0.1: f32
    %1 = multiply %0: f32, 1.5e-3: f32
    %2 = add %1: f32, +3: f32
    return %2: f32
}
"""
    )
    m = roundtrip(text)
    c = [o for i in m["f"].body for o in i.operands if isinstance(o, Const)]
    assert [x.value for x in c] == [float(np.float32(0.1)), float(np.float32(1.5e-3)), 3.0]
    assert "0.1: f32" in str(m) and "0.0015: f32" in str(m)


def test_module_and_stage_are_optional():
    m = dq.parse("func @f: (i32) -> i32 {\n'entry(%x: i32):\n  return %x: i32\n}")
    assert (m.name, m.stage) == ("main", "raw")
    assert m["f"].ret is m["f"].params[0]
    assert m["f"].result_type == TensorType((), I32)
    assert dq.parse(str(m)).stage == "raw"
    assert dq.parse('module "x"\nstage optimizable\n').stage == "optimizable"
