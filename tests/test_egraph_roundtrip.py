"""Loader and unloader: IR -> egglog terms -> serialized e-graph -> IR computes the same thing."""

import numpy as np
import pytest

from dlvm_eq.egraph import EGraphSession, class_types, unload
from dlvm_eq.egraph.lets import egg_float
from dlvm_eq.ir import F32, F64, FunctionBuilder, Module, interpret, scalar, tensor, verify


def _round_trip(fn, module=None):
    module = module or Module("t", functions={fn.name: fn})
    sess = EGraphSession()
    prog = sess.add_function(fn, module)
    sess.run_analysis()
    g = sess.serialize(prog.roots)
    choice = {}
    for cls in g.classes:
        if g.is_term_class(cls):
            nodes = g.term_nodes(cls)
            assert len(nodes) == 1, "no rewrites ran: one node per class"
            choice[cls] = nodes[0]
    out = unload(g, choice, prog, g.roots)
    m2 = Module("t", functions={out.name: out})
    verify(m2)
    return module, m2, g, prog


def _mixed_function():
    b = FunctionBuilder(
        "f", [tensor(2, 3, F32), tensor(3, F32), tensor(3, 4, F32)], ["x", "y", "w"]
    )
    x, y, w = b.params
    z = b.emit("add", [x, y])
    r = b.emit("reduce", [z], combinator="max", init=-np.inf, axes=(0, 1))
    e = b.emit("exp", [b.emit("multiply", [z, b.const(2, F32)])])
    t = b.emit("transpose", [b.emit("dot", [e, w])])
    s = b.emit("reduce", [t], combinator="add", init=1.5, axes=(0, 1))
    lit = b.emit("literal", [], value=np.array([1.0, 2.0, 3.0]), type=tensor(3, F32))
    c = b.emit("concatenate", [y, lit, y], axis=0)
    p = b.emit("squeezeShape", [b.emit("padShape", [y], at=0)], at=0)
    return b.finish([r, s, t, c, p])


def test_round_trip_agrees_with_interpreter():
    m1, m2, _, _ = _round_trip(_mixed_function())
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((2, 3)), rng.standard_normal(3), rng.standard_normal((3, 4))]
    for a, b in zip(
        interpret(m1, "f", *args, float64=True), interpret(m2, "f", *args, float64=True)
    ):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_multi_axis_reduce_merges_back():
    _, m2, _, _ = _round_trip(_mixed_function())
    reduces = [i for i in m2["f"].body if i.op == "reduce"]
    assert sorted(tuple(i.attrs["axes"]) for i in reduces) == [(0, 1), (0, 1)]
    assert [i.attrs["init"] for i in reduces if i.attrs["combinator"] == "add"] == [1.5]


def test_shared_values_stay_shared():
    b = FunctionBuilder("g", [tensor(4, F64)], ["x"])
    (x,) = b.params
    h = b.emit("tanh", [x])
    for _ in range(20):  # a DAG whose tree would have 2^20 leaves
        h = b.emit("add", [h, h])
    _, m2, g, _ = _round_trip(b.finish(h))
    assert len(m2["g"].body) == 21
    assert len([c for c in g.classes if g.is_term_class(c)]) == 22


def test_class_types_match_ir_types():
    fn = _mixed_function()
    _, _, g, prog = _round_trip(fn)
    types = class_types(g, prog.var_types, prog.literals)
    assert [types[r] for r in g.roots] == list(fn.result_type.elements)


def test_broadcasts_are_explicit_in_the_egraph_and_implicit_again_after():
    b = FunctionBuilder("h", [tensor(2, 3, F32), scalar(F32)], ["x", "s"])
    x, s = b.params
    fn = b.finish(b.emit("multiply", [x, b.emit("add", [s, b.const(1, F32)])]))
    _, m2, g, _ = _round_trip(fn)
    ops = {g.nodes[n]["op"] for n in g.nodes}
    assert "Broadcast" in ops
    assert [i.op for i in m2["h"].body] == ["add", "multiply"]


@pytest.mark.parametrize(
    "v", [0.0, -0.0, 1.0, 1e-7, 3.4028234663852886e38, float("inf"), float("-inf"), 0.1, 5e-324]
)
def test_float_literals_survive_egglog(v):
    sess = EGraphSession(schema=False)
    out = sess.run_text(f"(let $a {egg_float(v)}) (extract $a)")
    assert float(str(out[-1]).strip()) == v
