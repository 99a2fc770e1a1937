"""DLVM's control-flow graphs (blocks with arguments, `branch`, `conditional`): reducible loops
become `while`, if/else diamonds become `cond`, irreducible flow is a located error. The
parsed program runs on the interpreter and compiled, against numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.errors import SourceError
from dlvm_eq.ir import verify
from dlvm_eq.ir.parser import parse

DATA = Path(__file__).parent / "data" / "control_flow"
RNG = np.random.default_rng(3)


def loop_ref(x, w):
    h = x
    for _ in range(10):
        h = np.tanh(h @ w + x)
    s = h.sum()
    return (s * s if s > 0 else -s) + 1


def nested_ref(x):
    h = x
    for _ in range(3):
        for _ in range(2):
            h = h * 2 + 1
        h = h - 5 if h.sum() > 5 else h + 1
    return h


def test_loop_and_diamond_become_while_and_cond():
    m = dq.load(DATA / "cfg_loop.dl")
    verify(m)
    text = str(m)
    assert "= while @f.loop.cond do @f.loop.body carry (0: i32, %x: <2 x 3 x f32>)" in text
    assert "= cond %p: bool then @f.done.then else @f.done.else(" in text
    assert str(parse(text)) == text  # the structured spelling round-trips
    for _ in range(3):
        x = RNG.standard_normal((2, 3)).astype(np.float32)
        w = (RNG.standard_normal((3, 3)) * 0.5).astype(np.float32)
        want = loop_ref(x, w)
        assert float(dq.interpret(m, "f", x, w)) == pytest.approx(want, rel=1e-5)
        assert float(dq.compile(m, "f")(x, w)) == pytest.approx(want, rel=1e-5)


def test_nested_loops_and_a_diamond_in_a_loop_body():
    m = dq.load(DATA / "cfg_nested.dl")
    verify(m)
    assert str(parse(str(m))) == str(m)
    for x in (np.zeros(4, np.float32), RNG.standard_normal(4).astype(np.float32) * 3):
        np.testing.assert_allclose(dq.interpret(m, "f", x), nested_ref(x), rtol=1e-6)
        np.testing.assert_allclose(dq.compile(m, "f")(x), nested_ref(x), rtol=1e-6)
    for v in (-2.0, 3.0):
        x = np.float32(v)
        assert float(dq.interpret(m, "sign", x)) == abs(v)
        assert float(dq.compile(m, "sign")(x)) == abs(v)


def _error(text: str) -> str:
    with pytest.raises(SourceError) as e:
        parse(text)
    return str(e.value)


HEAD = 'module "m"\nstage raw\n\n'


def test_irreducible_flow_is_a_located_error():
    text = (
        HEAD
        + """func @f: (f32, bool) -> f32 {
'entry(%x: f32, %p: bool):
    conditional %p: bool then 'a(%x: f32) else 'b(%x: f32)
'a(%u: f32):
    %q = greaterThan %u: f32, 10: f32
    conditional %q: bool then 'out(%u: f32) else 'b(%u: f32)
'b(%v: f32):
    %w = add %v: f32, 1: f32
    branch 'a(%w: f32)
'out(%r: f32):
    return %r: f32
}
"""
    )
    msg = _error(text)
    assert "irreducible control flow" in msg and ":" in msg.split("error")[0]


def test_a_loop_left_from_its_body_is_a_located_error():
    text = (
        HEAD
        + """func @f: (f32) -> f32 {
'entry(%x: f32):
    branch 'loop(%x: f32)
'loop(%h: f32):
    %c = lessThan %h: f32, 10: f32
    conditional %c: bool then 'body() else 'done(%h: f32)
'body():
    %h2 = add %h: f32, 1: f32
    %big = greaterThan %h2: f32, 5: f32
    conditional %big: bool then 'done(%h2: f32) else 'loop(%h2: f32)
'done(%r: f32):
    return %r: f32
}
"""
    )
    msg = _error(text)
    assert ":13:5:" in msg and "leaves loop 'loop" in msg
