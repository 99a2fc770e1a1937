"""scan, while, cond and switch in the IR: printed and parsed (round trip), located parse
errors, the verifier's messages naming the value, the interpreter against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from control_flow_programs import LOOPS, loops_module, ref_main

from dlvm_eq.errors import IRError, SourceError
from dlvm_eq.ir import F32, FunctionBuilder, Module, interpret, tensor, verify
from dlvm_eq.ir.control_flow import module_with_bodies
from dlvm_eq.ir.parser import parse

T4 = tensor(4, F32)


def test_round_trip_is_stable():
    text = LOOPS.read_text()
    m = parse(text)
    verify(m)
    assert str(m) == text.replace("2: f32", "2.0: f32")  # the printer's float spelling
    assert str(parse(str(m))) == str(m)


def test_scan_spelling_groups_are_optional():
    text = """module "m"
stage raw

func @f: (<3 x f32>) -> <5 x 3 x f32> {
'entry(%x: <3 x f32>):
    %r = scan @g with (%x: <3 x f32>) length 5
    return %r: <5 x 3 x f32>
}

func @g: (<3 x f32>) -> <3 x f32> {
'entry(%x: <3 x f32>):
    %0 = exp %x: <3 x f32>
    return %0: <3 x f32>
}
"""
    m = parse(text)
    assert str(m) == text
    x = np.array([0.0, 1.0, -1.0], np.float32)
    np.testing.assert_allclose(interpret(m, "f", x), np.stack([np.exp(x)] * 5), rtol=1e-6)


def test_zero_length_scan_returns_init_and_empty_stack():
    text = LOOPS.read_text().replace("length 8", "length 0").replace("<8 x", "<0 x")
    m = parse(text)
    h, w = np.ones(4, np.float32), np.ones((3, 4), np.float32)
    c, ys = interpret(m, "main", h, np.zeros((0, 3), np.float32), w)
    np.testing.assert_array_equal(c, h)
    assert ys.shape == (0, 4) and ys.dtype == np.float32


def test_interpreter_float64_runs_bodies_in_float64():
    m = loops_module()
    rng = np.random.default_rng(1)
    h, xs, w = (rng.standard_normal(s).astype(np.float32) for s in ((4,), (8, 3), (3, 4)))
    c, ys = interpret(m, "main", h, xs, w, float64=True)
    assert c.dtype == np.float64 and ys.dtype == np.float64
    want_c, want_ys = ref_main(*(a.astype(np.float64) for a in (h, xs, w)))
    np.testing.assert_allclose(ys, want_ys, rtol=1e-12)


def _error(text: str, exc=SourceError) -> str:
    with pytest.raises(exc) as e:
        parse(text)
    return str(e.value)


def test_carry_type_mismatch_names_the_value_and_line():
    text = LOOPS.read_text().replace("carry (%h0: <4 x f32>)", "carry (%xs: <8 x 3 x f32>)")
    msg = _error(text)
    assert ":6:" in msg and "%xs is <8 x 3 x f32>" in msg and "@step" in msg and "%h" in msg


def test_scan_length_must_match_xs():
    msg = _error(LOOPS.read_text().replace("length 8", "length 7"))
    assert "%xs is <8 x 3 x f32>, which does not have 7 steps" in msg


def test_unknown_body_is_located():
    msg = _error(LOOPS.read_text().replace("scan @step", "scan @stpe"))
    assert ":6:" in msg and "no function @stpe" in msg


def test_branches_that_disagree():
    text = LOOPS.read_text().replace(
        "func @ex: (<4 x f32>) -> <4 x f32> {\n'entry(%x: <4 x f32>):\n    %0 = exp %x: <4 x f32>\n"
        "    return %0: <4 x f32>",
        "func @ex: (<4 x f32>) -> f32 {\n'entry(%x: <4 x f32>):\n"
        "    %0 = reduce %x: <4 x f32> by add init 0: f32 along 0\n    return %0: f32",
    )
    msg = _error(text)
    assert (
        "branches disagree" in msg and "@neg returns <4 x f32>" in msg and "@ex returns f32" in msg
    )


def test_while_condition_must_return_bool():
    text = LOOPS.read_text().replace("while @below do", "while @count do")
    assert "@count must return bool" in _error(text)


def test_recursive_body_is_an_error():
    text = LOOPS.read_text().replace(
        "%0 = exp %x: <4 x f32>", "%0 = cond true: bool then @neg else @ex(%x: <4 x f32>)"
    )
    assert "recursive cond" in _error(text)


def test_syntax_error_says_what_was_expected():
    msg = _error(LOOPS.read_text().replace(" length 8 reverse", " reverse"))
    assert "expected" in msg and "length" in msg


def test_verifier_names_the_value_for_built_ir():
    g = FunctionBuilder("g", [T4])
    body = g.finish(g.emit("exp", [g.params[0]]))
    f = FunctionBuilder("f", [tensor(3, F32), T4])
    x, y = f.params
    r = f.emit("scan", [y], body=body, length=2, reverse=False, carries=1, xs=0)
    fn = f.finish(r)
    fn.body[0].operands = [x]  # as a pass with a bug might leave it
    m = Module("m")
    module_with_bodies(m, fn)
    with pytest.raises(IRError, match=r"in @f: %0: scan: %arg0 is <3 x f32> but @g.s parameter"):
        verify(m)


def test_body_must_belong_to_the_module():
    g = FunctionBuilder("g", [T4])
    body = g.finish(g.emit("exp", [g.params[0]]))
    f = FunctionBuilder("f", [T4])
    fn = f.finish(
        f.emit("scan", [f.params[0]], body=body, length=2, reverse=False, carries=1, xs=0)
    )
    m = Module("m")
    m.add(fn)
    with pytest.raises(IRError, match="not a function of the module"):
        verify(m)


def test_module_with_bodies_renames_a_taken_name():
    g = FunctionBuilder("f", [T4])
    body = g.finish(g.emit("exp", [g.params[0]]))
    f = FunctionBuilder("f", [T4])
    fn = f.finish(f.emit("scan", [f.params[0]], body=body, length=3, reverse=True, carries=1, xs=0))
    m = Module("m")
    module_with_bodies(m, fn)
    verify(m)
    assert list(m.functions) == ["f", "f.1"]
    again = parse(str(m))
    x = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    np.testing.assert_allclose(interpret(again, "f", x), np.exp(np.exp(np.exp(x))), rtol=1e-6)
