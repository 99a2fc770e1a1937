"""Recomputation versus storing of forward values in the backward pass (issue 17) is the fusion
extraction's decision (egraph/fusion_decision.py, extract/fusion_cost.py), priced with the
machine's costs (a calibrated profile's flop rate and op classes where there is one): a forward
value t that the adjoint reads is either kept in a buffer by the forward kernel (written once,
read by the backward kernel) or recomputed inside the backward kernel from what it reads anyway.

Here t feeds the forward's product (t*t) @ w and the adjoint 2 t dY: with cheap flops a cheap t
(x*2 + 1) is recomputed, and the same program on a machine whose flops are dear stores it; a
dear t (exp(sin x)) is stored there too. Both plans compute what the interpreter computes."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.ad import adjoint_function
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.egraph.fusion_decision import decide_fusion
from dlvm_eq.extract.machine import Machine
from dlvm_eq.ir import interpret
from dlvm_eq.ir.inline import flatten
from dlvm_eq.ir.module import Module
from dlvm_eq.pipeline import compile

RNG = np.random.default_rng(0)
# the shipped CPU defaults, and one whose elementwise flops cost 50 times more
CHEAP_FLOPS = Machine("cheap-flops", bandwidth=40e9, flop_rate=100e9, blas_rate=300e9, launch=2e-6)
DEAR_FLOPS = Machine("dear-flops", bandwidth=40e9, flop_rate=2e9, blas_rate=300e9, launch=2e-6)
PRE = {"cheap": lambda x: x * 2.0 + 1.0, "dear": lambda x: dq.exp(dq.sin(x))}
T_OP = {"cheap": "add", "dear": "exp"}


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _step(kind: str, x, w) -> Module:
    pre = PRE[kind]

    def f(x, w):
        t = pre(x)
        return dq.sum((t * t) @ w)

    fn = dq.make_ir(f)(x, w)["f"]
    grad = adjoint_function(
        None, fn, wrt=(0, 1), keeping=(0,), tuple_result=True, optimize=False, name="step"
    )
    module = Module("step")
    module.add(grad)
    return module


def _t_stored(module: Module, kind: str, mc: Machine) -> bool:
    flat = flatten(module["step"], module)
    # the forward's t: the first such value (the adjoint's sums come after it)
    t = next(
        i.result for i in flat.body if i.op == T_OP[kind] and i.result.type.shape == (256, 128)
    )
    # t is read by the forward kernel (t*t) and by the backward one (2 t dY): two kernels
    assert sum(1 for i in flat.body for o in i.operands if o is t) >= 2
    return id(t) in decide_fusion(flat, target=mc).materialize


@pytest.mark.parametrize(
    "kind, mc, stored",
    [("cheap", CHEAP_FLOPS, False), ("cheap", DEAR_FLOPS, True), ("dear", DEAR_FLOPS, True)],
)
def test_the_backward_recomputes_or_stores_a_forward_value_by_the_machine_costs(kind, mc, stored):
    x = RNG.standard_normal((256, 128)).astype(np.float32)
    w = RNG.standard_normal((128, 32)).astype(np.float32)
    module = _step(kind, x, w)
    assert _t_stored(module, kind, mc) is stored
    got = compile(module, "step", optimize=False)(x, w)
    want = interpret(module, "step", x, w, float64=True)
    for g, wv in zip(got, want):
        np.testing.assert_allclose(
            g, wv, rtol=1e-4, atol=1e-4 * max(1.0, float(np.max(np.abs(wv))))
        )
