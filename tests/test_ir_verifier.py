"""Verifier messages name the function, the value and the mismatch."""

import pytest

from dlvm_eq.errors import IRError
from dlvm_eq.ir import (
    F32,
    F64,
    AdjointDecl,
    Const,
    Function,
    Instruction,
    Module,
    TensorType,
    Value,
    verify,
    verify_function,
)

V2 = TensorType((2,), F32)
V3 = TensorType((3,), F32)
S = TensorType((), F32)


def fn_with(body, ret, params, result_type=None, name="f"):
    return Function(name, params, result_type or ret.type, body, ret)


def test_wrong_declared_result_type():
    x = Value("x", V2)
    y = Value("y", V3)
    fn = fn_with([Instruction(y, "exp", [x])], y, [x])
    with pytest.raises(IRError) as info:
        verify_function(fn)
    msg = str(info.value)
    assert "@f" in msg and "%y is declared <3 x f32> but exp gives <2 x f32>" in msg


def test_use_before_definition():
    x, z, y = Value("x", V2), Value("z", V2), Value("y", V2)
    fn = fn_with([Instruction(y, "add", [x, z]), Instruction(z, "exp", [x])], y, [x])
    with pytest.raises(IRError, match=r"in @f: %y uses %z before it is defined"):
        verify_function(fn)


def test_type_rule_violation_names_value_and_shapes():
    x, w, y = Value("x", V2), Value("w", V3), Value("y", V2)
    fn = fn_with([Instruction(y, "add", [x, w], location=("m.dl", 7, 5))], y, [x, w])
    with pytest.raises(IRError) as info:
        verify_function(fn)
    msg = str(info.value)
    assert msg.startswith("m.dl:7:5: in @f: %y: add: shapes do not broadcast")
    assert "<2 x f32>" in msg and "<3 x f32>" in msg


def test_dtype_mismatch():
    x, d, y = Value("x", V2), Value("d", TensorType((2,), F64)), Value("y", V2)
    fn = fn_with([Instruction(y, "multiply", [x, d])], y, [x, d])
    with pytest.raises(IRError, match=r"@f: %y: multiply: operands have different data types"):
        verify_function(fn)


def test_return_type_mismatch():
    x = Value("x", V2)
    fn = Function("g", [x], V3, [], x)
    with pytest.raises(
        IRError, match=r"in @g: returns <2 x f32> but is declared to return <3 x f32>"
    ):
        verify_function(fn)


def test_defined_twice():
    x, y = Value("x", V2), Value("y", V2)
    fn = fn_with([Instruction(y, "exp", [x]), Instruction(y, "exp", [x])], y, [x])
    with pytest.raises(IRError, match=r"@f: %y is defined twice"):
        verify_function(fn)


def test_missing_body():
    with pytest.raises(IRError, match=r"in @h: function has no body"):
        verify_function(Function("h", [Value("x", S)], S))


def test_apply_arguments_checked_against_callee():
    a = Value("a", S)
    g = Function("g", [a], S, [], a)
    x, y = Value("x", V2), Value("y", S)
    f = fn_with([Instruction(y, "apply", [x], {"callee": "g", "type": S})], y, [x])
    m = Module("m")
    m.add(g)
    m.add(f)
    with pytest.raises(IRError, match=r"in @f: %y: @g expects \(f32\), got \(<2 x f32>\)"):
        verify(m)


def test_adjoint_of_unknown_function():
    m = Module("m")
    m.add(Function("d", [Value("x", S)], S, adjoint=AdjointDecl(of="nope")))
    with pytest.raises(IRError, match=r"in @d: adjoint of unknown function @nope"):
        verify(m)


def test_unknown_op():
    x, y = Value("x", V2), Value("y", V2)
    fn = fn_with([Instruction(y, "frobnicate", [x])], y, [x])
    with pytest.raises(IRError, match=r"@f: %y: unknown op 'frobnicate'"):
        verify_function(fn)


def test_good_function_verifies():
    x, y = Value("x", V2), Value("y", V2)
    fn = fn_with([Instruction(y, "add", [x, Const.of(1.0, F32)])], y, [x])
    verify_function(fn)
