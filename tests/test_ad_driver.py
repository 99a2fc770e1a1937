"""The differentiator: DLVM declarations (wrt, keeping, seedable, from) against closed forms,
declared adjoints in .dl files (interpret, optimize, the `grad` command), errors, and linear
growth of the adjoint program on a heavily shared DAG."""

from __future__ import annotations

import numpy as np
import pytest
from test_adjoint_rules import fd_check

import dlvm_eq as dq
from dlvm_eq.ad import AdjointError, adjoint_function, synthesize_declared
from dlvm_eq.cli import main
from dlvm_eq.ir import F32, F64, FunctionBuilder, Module, tensor
from dlvm_eq.ir.interp import run_function

# f(x, y) = (x * y, sum(x * y * x)):  d/dx of output 1 is 2 x y, d/dy is x^2
SOURCE = """
module "decl"
stage raw

func @f: (<3 x f32>, <3 x f32>) -> (<3 x f32>, f32) {
'entry(%x: <3 x f32>, %y: <3 x f32>):
    %p = multiply %x: <3 x f32>, %y: <3 x f32>
    %q = multiply %p: <3 x f32>, %x: <3 x f32>
    %s = reduce %q: <3 x f32> by add init 0: f32 along 0
    %r = literal (%p: <3 x f32>, %s: f32): (<3 x f32>, f32)
    return %r: (<3 x f32>, f32)
}

[adjoint @f from 1 wrt 0, 1 keeping 1]
func @f_keep: (<3 x f32>, <3 x f32>) -> (f32, <3 x f32>, <3 x f32>)

[adjoint @f from 0 wrt 1 seedable]
func @f_vjp: (<3 x f32>, <3 x f32>, <3 x f32>) -> <3 x f32>

[adjoint @f wrt 0]
func @f_all: (<3 x f32>, <3 x f32>) -> (<3 x f32>)
"""

X = np.array([1.0, -2.0, 0.5], np.float32)
Y = np.array([3.0, 0.25, -1.0], np.float32)


@pytest.fixture(scope="module")
def module():
    return dq.parse(SOURCE, "decl.dl")


def test_keeping_and_from(module):
    s, dx, dy = dq.interpret(module, "f_keep", X, Y)
    np.testing.assert_allclose(s, np.sum(X * Y * X), rtol=1e-6)
    np.testing.assert_allclose(dx, 2 * X * Y, rtol=1e-6)
    np.testing.assert_allclose(dy, X * X, rtol=1e-6)


def test_seedable_is_a_vector_jacobian_product(module):
    seed = np.array([0.5, -1.0, 2.0], np.float32)
    dy = dq.interpret(module, "f_vjp", X, Y, seed)
    np.testing.assert_allclose(dy, seed * X, rtol=1e-6)


def test_without_from_every_output_is_seeded_with_ones(module):
    (dx,) = dq.interpret(module, "f_all", X, Y)  # d/dx [sum(x*y) + sum(x*y*x)]
    np.testing.assert_allclose(dx, Y + 2 * X * Y, rtol=1e-6)


def test_synthesized_function_keeps_the_declaration(module):
    fn = synthesize_declared(module, module["f_keep"])
    assert fn.name == "f_keep" and fn.adjoint is module["f_keep"].adjoint and not fn.is_declaration
    assert synthesize_declared(module, module["f_keep"]) is fn  # cached
    again = dq.parse(str(Module("m", functions={"f": module["f"], "f_keep": fn})))
    np.testing.assert_allclose(dq.interpret(again, "f_keep", X, Y)[1], 2 * X * Y, rtol=1e-6)


def test_declared_signature_must_match():
    bad = (
        SOURCE.split("[adjoint")[0]
        + """
[adjoint @f from 1 wrt 0]
func @g: (<3 x f32>, <3 x f32>) -> (f32, <3 x f32>)
"""
    )
    m = dq.parse(bad)
    with pytest.raises(
        AdjointError,
        match=r"@g is declared .* but the adjoint of @f from 1 wrt 0 has type "
        r"\(<3 x f32>, <3 x f32>\) -> <3 x f32>",
    ):
        dq.interpret(m, "g", X, Y)


def test_optimize_synthesizes_declared_adjoints(module):
    if not hasattr(dq, "optimize"):
        pytest.skip("dq.optimize is not there")
    out = dq.optimize(module).module
    assert not out["f_keep"].is_declaration
    np.testing.assert_allclose(dq.interpret(out, "f_keep", X, Y)[2], X * X, rtol=1e-6)


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(wrt=(2,)), "wrt 2 is out of range"),
        (dict(wrt=(0, 0)), "repeats a parameter"),
        (dict(from_index=2), "from 2 is out of range"),
        (dict(keeping=(5,)), "keeping 5 is out of range"),
    ],
)
def test_bad_declarations(module, kw, message):
    with pytest.raises(AdjointError, match=message):
        adjoint_function(module, module["f"], **kw)


def test_int_parameters_and_outputs_are_refused():
    b = FunctionBuilder("h", [tensor(3, F32), tensor(3, dq.ir.I32)], ["x", "n"])
    x, n = b.params
    fn = b.finish(b.emit("multiply", [x, b.emit("dataTypeCast", [n], dtype=dq.ir.F32)]))
    with pytest.raises(AdjointError, match=r"parameter 1 \(%n: <3 x i32>\) is not a float tensor"):
        adjoint_function(None, fn, wrt=(1,))
    adj = adjoint_function(None, fn)  # default wrt: the float parameters only
    assert [p.type for p in adj.params] == [p.type for p in fn.params]
    np.testing.assert_array_equal(
        run_function(None, adj, [X, np.array([1, 2, 3], np.int32)]), [1, 2, 3]
    )


def test_parameter_that_does_not_matter_gets_zeros():
    b = FunctionBuilder("h", [tensor(2, F32), tensor(2, 3, F32)], ["x", "unused"])
    fn = b.finish(b.emit("exp", [b.params[0]]))
    _, dz = run_function(
        None, adjoint_function(None, fn), [np.zeros(2, np.float32), np.ones((2, 3), np.float32)]
    )
    np.testing.assert_array_equal(dz, np.zeros((2, 3)))


def test_gradient_of_a_declared_adjoint_is_second_order(module):
    # the adjoint @f_vjp(x, y, seed) = seed * x: its own adjoint w.r.t. x is the seed's seed * seed
    adj2 = adjoint_function(module, module["f_vjp"], wrt=(0,), seedable=True)
    s2 = np.array([1.0, 2.0, 3.0], np.float32)
    seed = np.array([0.5, -1.0, 2.0], np.float32)
    np.testing.assert_allclose(run_function(module, adj2, [X, Y, seed, s2]), seed * s2, rtol=1e-6)


@pytest.mark.parametrize("optimize", [True, False])
def test_optimize_flag_gives_the_same_gradient(optimize):
    b = FunctionBuilder("h", [tensor(4, 3, F64), tensor(3, 2, F64)], ["a", "w"])
    a, w = b.params
    y = b.emit("tanh", [b.emit("dot", [a, w])])
    fn = b.finish(
        b.emit("reduce", [b.emit("multiply", [y, y])], combinator="add", init=0.0, axes=(0, 1))
    )
    rng = np.random.default_rng(1)
    fd_check(
        fn, [rng.standard_normal((4, 3)), rng.standard_normal((3, 2))], rng=rng, optimize=optimize
    )


# ---------------------------------------------------------------- linear in program size


def _layers(n: int):
    b = FunctionBuilder("deep", [tensor(8, F32)], ["x"])
    (x,) = b.params
    for _ in range(n):  # x = tanh(x*x + x): every value used three times
        x = b.emit("tanh", [b.emit("add", [b.emit("multiply", [x, x]), x])])
    return b.finish(b.emit("reduce", [x], combinator="add", init=0.0, axes=(0,)))


def test_adjoint_of_a_shared_dag_grows_linearly():
    sizes = {n: len(adjoint_function(None, _layers(n)).body) for n in (15, 30, 60)}
    assert 1.8 <= sizes[60] / sizes[30] <= 2.2 and 1.8 <= sizes[30] / sizes[15] <= 2.2, sizes
    assert sizes[30] <= 10 * 30  # a handful of ops per layer, no blow-up
    rng = np.random.default_rng(0)
    fd_check(_layers(30), [rng.uniform(-0.5, 0.5, 8)], rng=rng, rtol=1e-5)


# ---------------------------------------------------------------- dlvm-eq grad


def test_grad_command_prints_a_parsable_adjoint(tmp_path, capsys, module):
    path = tmp_path / "decl.dl"
    path.write_text(SOURCE)
    assert main(["grad", str(path), "-f", "f", "--from", "1", "--wrt", "1", "--keeping", "1"]) == 0
    out, err = capsys.readouterr()
    assert (
        out.startswith("func @f_grad: (<3 x f32>, <3 x f32>) -> (f32, <3 x f32>) {") and err == ""
    )
    printed = dq.parse(SOURCE + "\n" + out)
    s, dy = dq.interpret(printed, "f_grad", X, Y)
    np.testing.assert_allclose(dy, X * X, rtol=1e-6)
    assert main(["grad", str(path), "-f", "f", "--from", "0", "--wrt", "0", "--seedable"]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("func @f_grad: (<3 x f32>, <3 x f32>, <3 x f32>) -> <3 x f32> {")


def test_grad_command_reports_mistakes(tmp_path, capsys):
    path = tmp_path / "decl.dl"
    path.write_text(SOURCE)
    assert main(["grad", str(path), "-f", "f", "--wrt", "7"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "wrt 7 is out of range" in err and "Traceback" not in err
    assert main(["grad", str(path), "-f", "nope"]) == 1
    assert "no function @nope" in capsys.readouterr()[1]


def test_adjoint_of_a_declared_adjoint(module):
    src = (
        SOURCE
        + """
[adjoint @f_vjp wrt 0 seedable]
func @f_vjp2: (<3 x f32>, <3 x f32>, <3 x f32>, <3 x f32>) -> <3 x f32>
"""
    )
    m = dq.parse(src)
    seed, s2 = np.array([0.5, -1.0, 2.0], np.float32), np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_allclose(dq.interpret(m, "f_vjp2", X, Y, seed, s2), seed * s2, rtol=1e-6)
