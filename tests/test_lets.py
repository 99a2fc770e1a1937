"""Loaded programs are data (egraph/lets.py): interned Lets, written as egglog text only when
sent. The text the data gives is the text the loaders used to write line by line, and walks
over the Lets stay linear on DAGs whose trees are exponential."""

import math
import time

import pytest

from dlvm_eq.egraph.lets import Let, LetTable, commands, inline
from dlvm_eq.egraph.loader import load_function
from dlvm_eq.egraph.values import MARKER, BoundValues
from dlvm_eq.ir import F32, F64, FunctionBuilder, Module, tensor
from dlvm_eq.ir.types import TensorType


def _doubling_dag(levels: int):
    """x_{k+1} = tanh(x_k * x_k + x_k): 3 values per level, 2^levels nodes as a tree."""
    b = FunctionBuilder("deep", [tensor(4, F64)], ["x"])
    (x,) = b.params
    for _ in range(levels):
        x = b.emit("tanh", [b.emit("add", [b.emit("multiply", [x, x]), x])])
    m = Module("m")
    m.add(b.finish(b.emit("reduce", [x], combinator="add", init=0.0, axes=(0,))))
    return m


def test_building_a_term_twice_is_one_let_and_attributes_are_told_apart_exactly():
    t = TensorType((3,), F32)
    lets = LetTable("v")
    x = lets.let("Var", ("x",), t)
    assert lets.let("Tanh", (x,), t) is lets.let("Tanh", (x,), t)
    # 0.0 == -0.0 and NaN != NaN in Python; as egglog terms 0.0 and -0.0 differ, NaN is NaN
    assert lets.let("Const", (0.0, "f32")) is not lets.let("Const", (-0.0, "f32"))
    assert lets.let("Const", (math.nan, "f32")) is lets.let("Const", (math.nan, "f32"))
    assert [let.name for let in lets.lets] == ["$v0_", "$v1_", "$v2_", "$v3_", "$v4_"]
    plain = LetTable("adj", intern=False)
    assert plain.let("Tanh", (x,)) is not plain.let("Tanh", (x,))


def test_a_let_is_written_with_its_operands_named_and_its_attributes_by_sort():
    t = TensorType((2, 3), F32)
    lets = LetTable("v")
    x = lets.let("Var", ('x "q"',), t)
    r = lets.let("Reduce", (x, "add", 0.0, 1), t.with_shape((2,)))
    v = lets.let("ReduceMap", (inline("Load", (x,)), "max", -math.inf, (0, 1)), TensorType((), F32))
    e = lets.let("ShapeCast", (x, ()), TensorType((6,), F32))
    assert r.command() == '(let $v1_ (Reduce $v0_ "add" 0.0 1))'
    assert v.term() == '(ReduceMap (Load $v0_) "max" -inf (vec-of 0 1))'
    assert e.term(lambda let: f"<{let.name}>") == "(ShapeCast <$v0_> (vec-empty))"
    assert x.command() == r'(let $v0_ (Var "x \"q\""))'
    assert r.children == (x,) and v.children == (v.args[0],)
    assert x.facts() == ["(set (shape $v0_) (vec-of 2 3))", '(set (dtype $v0_) "f32")']
    assert r.facts() == []  # only leaves: the analysis derives the rest
    with pytest.raises(TypeError, match="not an egglog attribute"):
        Let("$bad_", "Frob", ([1],)).term()


def test_rows_written_from_the_data_are_the_rows_the_text_gave():
    """The data path (BoundValues.bind) and the text path (the loader's lines, re-read by
    bind_lines) give egglog the same commands."""
    prog = load_function(_doubling_dag(5)["deep"], prefix="p0_")
    from_data = BoundValues().bind(prog.lets)
    from_text = BoundValues().bind_lines(commands(prog.lets))
    assert from_data == from_text
    assert f'(set ({MARKER} 0) (Var "x"))' in from_data
    assert "(set (shape (dlvm-value 0)) (vec-of 4))" in from_data
    assert "$" not in from_data  # every value is read through its row


def test_loading_and_costing_a_doubling_dag_is_linear():
    """60 levels are 2^60 tree nodes: a walk that revisits shared lets would never finish."""
    from dlvm_eq.egraph.optimize import loaded_cost

    m = _doubling_dag(60)
    t0 = time.perf_counter()
    prog = load_function(m["deep"], m)
    cost = loaded_cost(prog)
    took = time.perf_counter() - t0
    assert len(prog.lets) == 1 + 3 * 60 + 1  # x, per level 3 values, the sum
    assert 0 < cost < math.inf
    assert took < 30  # a hang guard, not a timing claim
    small = _doubling_dag(30)
    assert loaded_cost(load_function(small["deep"], small)) < cost


def test_the_reverse_pass_builds_lets_from_the_loaded_structure():
    from dlvm_eq.ad.driver import _ReversePass, configure

    m = _doubling_dag(3)
    fn = m["deep"]
    prog = load_function(fn, m, prefix="p0_")
    rev = _ReversePass(prog, fn, configure(fn))
    roots = rev.run()
    assert len(roots) == 1 and roots[0].startswith("$adj")
    adjoints = {let.args[0] for let in rev.adjoints}
    assert {let.ctor for let in rev.adjoints} == {"Adjoint"} and adjoints == {0, 1}
    # the use of x twice by the first multiply gives two Adjoint terms of it, added up
    first_multiply = next(let for let in prog.lets if let.ctor == "Multiply")
    assert sum(let.args[1] is first_multiply for let in rev.adjoints) == 2
    assert all(isinstance(let, Let) and let.name for let in rev.lets)
