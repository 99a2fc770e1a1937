"""`dlvm-eq fmt --cfg` (ir/cfg_printer.py): whiles and conds written as DLVM's blocks with
arguments, `branch` and `conditional`; the text reads back (ir/cfg.py) into a module that the
interpreter runs as the original, and printing that module again gives the same text. Random
programs with nested loops and branches (hypothesis) too."""

from __future__ import annotations

import operator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.cli import main
from dlvm_eq.ir import Module, interpret, verify
from dlvm_eq.ir.cfg_printer import print_module_cfg
from dlvm_eq.ir.control_flow import module_with_bodies
from dlvm_eq.ir.parser import load, parse

DATA = Path(__file__).parent / "data" / "control_flow"
FILES = ["cfg_loop.dl", "cfg_nested.dl", "loops.dl", "declared.dl"]


def arguments(fn, seed: int) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for t in fn.param_types:
        if t.dtype.numpy == np.bool_:
            out.append(np.bool_(rng.integers(2)))
        elif t.dtype.numpy == np.int32:
            out.append(np.int32(rng.integers(-1, 4)))
        else:
            out.append(rng.standard_normal(t.shape).astype(t.dtype.numpy))
    return out


def assert_same_results(a: Module, b: Module, seeds=range(3)) -> None:
    for name, fn in a.functions.items():
        if name not in b.functions or fn.is_declaration:
            continue
        for seed in seeds:
            args = arguments(fn, seed)
            want, got = interpret(a, name, *args), interpret(b, name, *args)
            want = want if isinstance(want, tuple) else (want,)
            got = got if isinstance(got, tuple) else (got,)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def round_trip(m: Module) -> str:
    text = print_module_cfg(m)
    back = parse(text, "<cfg>")
    verify(back)
    assert_same_results(m, back)
    assert print_module_cfg(back) == text  # a fixed point
    return text


@pytest.mark.parametrize("name", FILES)
def test_cfg_spelling_round_trips(name):
    text = round_trip(load(DATA / name))
    if name.startswith("cfg_"):  # written with blocks: no structured op is left
        assert "while @" not in text and "cond %" not in text


def test_while_and_cond_are_written_as_blocks():
    text = print_module_cfg(load(DATA / "loops.dl"))
    assert "while @" not in text and "cond %" not in text
    assert "    conditional %0: bool then 'body.0() else 'exit.0()" in text
    assert "'join.0(%join.0.0: <4 x f32>):" in text
    assert "scan @step" in text and "switch %k: i32 of @neg, @ex, @neg" in text  # no CFG form
    assert "func @step:" in text and "func @loop.loop.0.cond" not in text


def test_fmt_cfg_command(capsys, tmp_path):
    src = DATA / "cfg_nested.dl"
    assert main(["fmt", "--cfg", str(src)]) == 0
    out = capsys.readouterr().out
    assert out == print_module_cfg(load(src))
    f = tmp_path / "loops.dl"
    f.write_text((DATA / "loops.dl").read_text())
    assert main(["fmt", "--cfg", "-i", str(f)]) == 0
    assert_same_results(load(DATA / "loops.dl"), load(f))


UNARY = [dq.tanh, dq.sin, lambda v: v * 0.5, lambda v: v + 1.0]
BINARY = [operator.add, operator.mul, operator.sub]


def run_ops(ops, vals):
    vals = list(vals)
    for kind, k, a, b in ops:
        u, v = vals[a % len(vals)], vals[b % len(vals)]
        vals.append(UNARY[k](u) if kind == 0 else BINARY[k % 3](u, v))
    return vals[-1]


op_lists = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, 3), st.integers(0, 9), st.integers(0, 9)),
    min_size=1,
    max_size=4,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    op_lists,
    op_lists,
    op_lists,
    st.sampled_from(["while", "cond", "while in cond", "cond in while", "scan with cond"]),
    st.integers(0, 4),
    st.integers(0, 2**16),
)
def test_random_loops_and_branches_round_trip(a, b, c, shape, steps, seed):
    def branch(x, w):
        return dq.cond(dq.sum(x) > 0.0, lambda x: run_ops(a, [x, w]), lambda x: run_ops(b, [x]), x)

    def loop(x, w, inner):
        def body(s):
            i, h = s
            return i + 1, dq.tanh(inner(h, w))

        return dq.while_loop(lambda s: s[0] < steps, body, (0, x))[1]

    def f(x, w):
        if shape == "while":
            return loop(x, w, lambda h, w: run_ops(c, [h, w]))
        if shape == "cond":
            return branch(x, w) * 2.0
        if shape == "while in cond":
            return dq.cond(dq.sum(w) > 0.0, lambda x: loop(x, w, branch), lambda x: x - w, x)
        if shape == "cond in while":
            return loop(x, w, branch)
        return dq.scan(lambda h, _: (dq.tanh(branch(h, w)), None), x, None, length=steps)[0]

    x, w = np.random.default_rng(seed).standard_normal((2, 3)).astype(np.float32)
    traced = dq.make_ir(f)(x, w)
    fn = next(iter(traced.functions.values()))
    m = Module("random")
    module_with_bodies(m, fn)
    text = round_trip(m)
    if shape != "scan with cond":
        assert "conditional" in text and "while @" not in text
