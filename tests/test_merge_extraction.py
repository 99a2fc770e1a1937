"""The TASO merge extracted where it pays (issue 17): x@Wq, x@Wk, x@Wv become one product of
concatenated weights read through in-place column slices when x is large against the weights,
and stay three products when the weights' copy would cost more (a few rows times big
weights). In the training step, the adjoint's dX (dQ Wq^T + dK Wk^T + dV Wv^T) and the weights'
adjoints (x^T dQ, x^T dK, x^T dV) become one product each where the cost model says so. The
optimized programs agree with the interpreter, and their plans copy [[Wq|Wk]|Wv] once."""

from __future__ import annotations

import numpy as np
import pytest
from shipped_cost_model import shipped_cost_model  # noqa: F401 - autouse: the shipped cost model

import dlvm_eq as dq
from dlvm_eq.ad import adjoint_function
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.planning.plan import ConcatStep, CopyStep
from dlvm_eq.ir import interpret
from dlvm_eq.ir.module import Module
from dlvm_eq.pipeline import compile, plan_function

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def projections(wq, wk, wv, x):
    q, k, v = x @ wq, x @ wk, x @ wv
    return dq.sum(dq.tanh(q) * dq.sigmoid(k) * dq.tanh(v))


def _args(m: int, k: int, n: int):
    ws = [(RNG.standard_normal((k, n)) * k**-0.5).astype(np.float32) for _ in range(3)]
    return ws + [RNG.standard_normal((m, k)).astype(np.float32)]


def _optimized(module: Module, name: str) -> Module:
    # what extraction picks, not the never-slower guard's choice between plans
    return dq.optimize(module, name, budget={"seconds": 30.0}, never_slower=False).module


def _defs(fn) -> dict:
    return {ins.result.name: ins for ins in fn.body}


def _concat_leaves(fn, value) -> list[str]:
    defs = _defs(fn)

    def walk(v):
        ins = defs.get(getattr(v, "name", None))
        if ins is None or ins.op != "concatenate":
            return [v.name]
        return [n for o in ins.operands for n in walk(o)]

    return walk(value)


def _dots(fn):
    return [ins for ins in fn.body if ins.op == "dot"]


def test_projections_of_a_large_x_are_one_product_of_concatenated_weights():
    args = _args(2048, 256, 256)  # x 2 MiB, each weight 256 KiB
    module = dq.make_ir(projections)(*args)
    opt = _optimized(module, "projections")
    fn = opt["projections"]
    (dot,) = _dots(fn)
    assert dot.operands[0].name == "x" and sorted(_concat_leaves(fn, dot.operands[1])) == [
        "wk",
        "wq",
        "wv",
    ], fn
    defs = _defs(fn)

    def reads_dot(ins):  # a slice of the product, directly or through a slice
        src = defs.get(ins.operands[0].name)
        return src is dot or (src is not None and src.op == "slice" and reads_dot(src))

    assert sum(1 for ins in fn.body if ins.op == "slice" and reads_dot(ins)) >= 3, fn
    want = interpret(module, "projections", *args, float64=True)
    np.testing.assert_allclose(interpret(opt, "projections", *args, float64=True), want, rtol=1e-9)
    plan = plan_function(fn, opt)
    # the weights are copied once, the slices are read in place (no copy of the product)
    (concat,) = [s for s in plan.steps if isinstance(s, ConcatStep)]
    assert len(concat.parts) == 3
    assert not any(isinstance(s, CopyStep) for s in plan.steps), plan
    got = compile(opt, "projections", optimize=False)(*args)
    np.testing.assert_allclose(got, want, rtol=2e-4)


@pytest.mark.parametrize("m, k, n", [(16, 512, 512), (1, 1024, 1024)])
def test_projections_of_a_few_rows_by_big_weights_stay_three_products(m, k, n):
    """Measured here (OpenBLAS): x (16, 512) times three 512x512 weights 0.41-0.66 ms, one
    product of their concatenation with the copy 0.56-1.3 ms; (1, 1024) by 1024x1024:
    0.47-1.0 ms against 1.4-2.9 ms."""
    args = _args(m, k, n)
    module = dq.make_ir(projections)(*args)
    fn = _optimized(module, "projections")["projections"]
    assert len(_dots(fn)) == 3 and not any(ins.op == "concatenate" for ins in fn.body), fn


def _step(args, n_weights: int = 3) -> Module:
    fn = dq.make_ir(projections)(*args)["projections"]
    grad = adjoint_function(
        None,
        fn,
        wrt=tuple(range(n_weights + 1)),
        keeping=(0,),
        tuple_result=True,
        optimize=False,
        name="step",
    )
    module = Module("step")
    module.add(grad)
    return module


def test_the_adjoints_of_merged_projections_are_one_product_each():
    """x (2048, 256), three 256x16 weights: dQ, dK, dV are small (128 KiB each) and dX is 2 MiB,
    so three products writing dX-sized results and two adds cost more than one product of
    [dQ|dK|dV]; likewise x^T dQ, x^T dK, x^T dV become x^T [dQ|dK|dV]."""
    args = _args(2048, 256, 16)
    module = _step(args)
    opt = _optimized(module, "step")
    fn = opt["step"]
    dots = _dots(fn)
    assert len(dots) == 3, fn  # forward, the weights' adjoints, dX: 9 as written
    assert len(_dots(module["step"])) == 9
    defs = _defs(fn)
    dx = defs[defs[fn.ret.name].operands[4].name]  # results: loss, dWq, dWk, dWv, dX
    assert dx.op == "dot" and len(_concat_leaves(fn, dx.operands[0])) == 3, fn
    want = interpret(module, "step", *args, float64=True)
    got = interpret(opt, "step", *args, float64=True)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-10)
    compiled = compile(opt, "step", optimize=False)(*args)
    for w, g in zip(want, compiled):
        np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-4 * max(1.0, float(np.max(np.abs(w)))))


@pytest.mark.parametrize("shared", [False, True])
def test_a_concatenation_read_only_by_a_concatenation_is_copied_once(shared):
    a, b, c = (RNG.standard_normal((3, n)).astype(np.float32) for n in (1, 2, 4))

    def f(a, b, c):
        inner = dq.concatenate([a, b], axis=1)
        outer = dq.concatenate([inner, c], axis=1)
        return (outer, inner * 2.0) if shared else outer * 3.0

    module = dq.make_ir(f)(a, b, c)
    name = next(iter(module.functions))
    plan = plan_function(module[name], module)
    steps = [s for s in plan.steps if isinstance(s, ConcatStep)]
    # read by another op too, the inner one is planned (and read) as a buffer of its own
    assert [len(s.parts) for s in steps] == ([2, 2] if shared else [3]), plan
    got = compile(module, name, optimize=False)(a, b, c)
    want = interpret(module, name, a, b, c)
    for w, g in zip(want if shared else [want], got if shared else [got]):
        np.testing.assert_array_equal(g, w)
