"""rules/layout.egg's degenerate batched products: a batched product whose contraction has
length 1 is a broadcast multiply (bmm-outer), one whose right operand is a column a multiply
and a sum over the last axis (bmm-matvec). Each rule fires where it should and not where it
must not (the e-graph alone); the cost model prices a batch of tiny products above their fused
form (extract/target_cost.BATCH_ENTRY_SECONDS); random programs of batched products agree
after optimization with numpy in float64 (the value) and the reference interpreter (the
gradient)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from layout_checks import declarations, equal_after
from layout_checks import vec as _vec

import dlvm_eq as dq
from dlvm_eq.calibration.plan_cost import product_seconds
from dlvm_eq.extract.machine import MACHINES
from dlvm_eq.extract.target_cost import BATCH_ENTRY_SECONDS, TargetCost
from dlvm_eq.ir.types import F32, tensor

SHAPES = {
    "C": (4, 3, 1),  # a batch of columns
    "R": (4, 1, 5),  # a batch of rows
    "M": (4, 3, 6),  # a batch of matrices
    "V": (4, 6, 1),  # a batch of columns, length 6
    "N": (4, 6, 5),  # a batch of 6 x 5 matrices
    "P": (2, 4, 3, 1),  # rank 4
    "Q": (2, 4, 1, 5),
    "S": (3, 1),  # rank 2 (a Dot, not a batched product)
    "T": (1, 5),
}


def _equal_after(term: str, expected: str) -> bool:
    return equal_after(declarations({n: (s, "f32") for n, s in SHAPES.items()}), term, expected)


FIRES = [
    ("outer", "(BatchMatmul $C $R)", f"(Multiply (Broadcast $C {_vec(4, 3, 5)}) ?b)"),
    ("outer-rank-4", "(BatchMatmul $P $Q)", f"(Multiply ?a (Broadcast $Q {_vec(2, 4, 3, 5)}))"),
    ("matvec", "(BatchMatmul $M $V)", '(ShapeCast (Reduce (Multiply $M ?b) "add" 0.0 2) ?s)'),
]
HOLDS = [
    # a contraction of 6 is a real product
    ("product", "(BatchMatmul $M $N)", "(Multiply ?a ?b)"),
    ("product-no-reduce", "(BatchMatmul $M $N)", '(ShapeCast (Reduce ?a "add" 0.0 2) ?s)'),
    # an outer product is not a matrix-vector product: its column has length 1, nothing to sum
    ("outer-no-reduce", "(BatchMatmul $C $R)", '(ShapeCast (Reduce ?a "add" 0.0 2) ?s)'),
    # a 2-D product is algebra.egg's Dot, never a batched product
    ("dot", "(Dot $S $T)", "(Multiply ?a ?b)"),
]


@pytest.mark.parametrize("name,term,expected", FIRES, ids=[f[0] for f in FIRES])
def test_degenerate_batched_product_rule_fires(name, term, expected):
    assert _equal_after(term, expected)


@pytest.mark.parametrize("name,term,unexpected", HOLDS, ids=[h[0] for h in HOLDS])
def test_degenerate_batched_product_rule_holds(name, term, unexpected):
    assert not _equal_after(term, unexpected)


def test_a_batch_of_tiny_products_is_priced_above_its_fused_form():
    """64 entries of 16x32 @ 32x1 (the bilinear layer's forward): the batched product pays a
    call per entry, so that the multiply and the sum over the last axis are cheaper (they are:
    6.7 against ~3 us measured); a batch of one entry, or of entries that are real products, pays
    no entry's call; plan_cost prices the planned batched product with the same per-entry figure."""
    cost = TargetCost("cpu", {})
    a, b, out = tensor(64, 16, 32, F32), tensor(64, 32, 1, F32), tensor(64, 16, 1, F32)
    kids = (a, b)
    batched = cost.term_cost("BatchMatmul", out, kids.__getitem__)
    product = tensor(64, 16, 32, F32)
    fused = cost.elementwise_seconds("Multiply", product) + cost.kernel_seconds(
        product.size, tensor(64, 16, F32)
    )
    assert fused < batched
    one = (tensor(1, 16, 32, F32), tensor(1, 32, 1, F32))
    single = cost.term_cost("BatchMatmul", tensor(1, 16, 1, F32), one.__getitem__)
    assert single == pytest.approx(
        cost.machine.node_overhead + cost.dot_seconds(16, 32, 1), rel=1e-12
    )
    # entries of real products run in the batched GEMM's native loop: no call an entry (a
    # pointwise convolution's weight adjoint, 8 entries of 16x256x16)
    real = (tensor(8, 16, 256, F32), tensor(8, 256, 16, F32))
    pointwise = cost.term_cost("BatchMatmul", tensor(8, 16, 16, F32), real.__getitem__)
    assert pointwise == pytest.approx(
        cost.machine.node_overhead + cost.dot_seconds(8 * 16, 256, 16), rel=1e-12
    )
    mc = MACHINES["cpu"]
    entries = product_seconds(mc, 16, 32, 1, batch=64) - product_seconds(mc, 16, 32, 1, batch=1)
    assert entries > 64 * BATCH_ENTRY_SECONDS


# ---------------------------------------------------------------- whole programs

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    max_examples=20,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _program(F, kind, a, b, w):
    """A batched product of kind "outer" (B,m,1)@(B,1,n), "matvec" (B,m,k)@(B,k,1) or "full",
    then a map and a loss; with a bilinear einsum where kind is "einsum"."""
    if kind == "einsum":
        y = F.einsum("bi,oij,bj->bo", a[:, :, 0], w, b[:, 0, :])
    else:
        y = F.matmul(a, b) if F is np else a @ b
    return F.sum(F.tanh(y) * y)


@settings(**SETTINGS)
@given(
    st.sampled_from(("outer", "matvec", "full", "einsum")),
    st.integers(1, 6),
    st.integers(1, 5),
    st.integers(2, 5),
    st.integers(0, 2**16),
)
def test_random_batched_products_agree_after_the_rules(kind, batch, m, n, seed):
    rng = np.random.default_rng(seed)
    k = {"outer": 1, "matvec": n, "full": n}.get(kind, 1)
    a = rng.standard_normal((batch, m, k if kind != "einsum" else 1))
    b_shape = {"matvec": (batch, k, 1), "einsum": (batch, 1, n)}.get(kind, (batch, k, n))
    b = rng.standard_normal(b_shape)
    w = rng.standard_normal((3, m, n))
    if kind == "einsum":
        a = rng.standard_normal((batch, m, 1))
    want = _program(np, kind, a, b, w)

    def loss(a, b, w):
        return _program(dq, kind, a, b, w)

    got = float(dq.jit(loss)(a, b, w))  # float64 throughout
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * max(1.0, abs(want)))
    grads = dq.jit(dq.grad(loss, argnums=(0, 1, 2)))(a, b, w)
    refs = dq.jit(dq.grad(loss, argnums=(0, 1, 2)), target="interp")(a, b, w)
    for g, r in zip(grads, refs):
        r = np.asarray(r)
        np.testing.assert_allclose(
            np.asarray(g), r, rtol=1e-8, atol=1e-9 * max(1e-300, np.abs(r).max())
        )


def _bilinear(w, b, x, u, y):
    return dq.mean(dq.square(dq.einsum("bi,oij,bj->bo", x, w, u) + b - y))


def test_the_bilinear_layers_products_extract_as_maps():
    """The einsum bilinear layer's gradient (benchmarks/egraph_models.py's shape), differentiated
    without the algebra (as benchmarks/egraph_value.py builds its off program), then optimized:
    its matvec and its outer product are no batched products
    after optimization, and the program agrees with the interpreter."""
    from dlvm_eq.ad import adjoint_function
    from dlvm_eq.ir.module import Module

    rng = np.random.default_rng(2)
    args = tuple(
        rng.standard_normal(s).astype(np.float32)
        for s in ((16, 32, 32), (16,), (64, 32), (64, 32), (64, 16))
    )
    forward = dq.make_ir(_bilinear, name="bil")(*args)["bil"]
    grad = adjoint_function(
        None, forward, wrt=(0, 1), keeping=(0,), tuple_result=True, optimize=False
    )
    module = Module(grad.name)
    module.add(grad)
    plain = [i.op for i in module.functions[grad.name].body]
    result = dq.optimize(module, grad.name, never_slower=False)
    (fn,) = result.module.functions.values()
    ops = [i.op for i in fn.body]
    assert "batchMatmul" in plain and "batchMatmul" not in ops
    want = dq.interpret(module, grad.name, *args)
    got = dq.compile(result.module, grad.name, target="cpu", optimize=False)(*args)
    for g, r in zip(got, want):
        r = np.asarray(r, np.float64)
        np.testing.assert_allclose(np.asarray(g), r, rtol=1e-4, atol=1e-5 * np.abs(r).max())
