"""Tutorial: verify a gradient symbolically (sympy) and numerically, and find a wrong
hand-written adjoint with it.

Run from the repository root: `python docs/tutorials/verify_gradients.py`. Every claim the
page (docs/tutorials/verify-gradients.md) makes is an assert below; tests/test_tutorials.py
runs it.
"""

from __future__ import annotations

import numpy as np

import dlvm_eq as dq
from dlvm_eq.pipeline.gradient_check import check_grads
from dlvm_eq.verify import GradientCheckError, VerificationError, check_vjp, verify_gradient

# A forward function and a hand-written adjoint in DLVM IR: d/dx sum(tanh(x) * w) is
# w * (1 - tanh(x)^2). The adjoint below has a sign wrong: 1 + tanh(x)^2.
MODULE = """
module "handwritten"
stage raw

func @f: (<3 x f32>, <3 x f32>) -> f32 {
'entry(%x: <3 x f32>, %w: <3 x f32>):
    %t = tanh %x: <3 x f32>
    %p = multiply %t: <3 x f32>, %w: <3 x f32>
    %s = reduce %p: <3 x f32> by add init 0: f32 along 0
    return %s: f32
}

func @f_grad: (<3 x f32>, <3 x f32>) -> <3 x f32> {
'entry(%x: <3 x f32>, %w: <3 x f32>):
    %t = tanh %x: <3 x f32>
    %t2 = multiply %t: <3 x f32>, %t: <3 x f32>
    %d = add 1: f32, %t2: <3 x f32>
    %g = multiply %w: <3 x f32>, %d: <3 x f32>
    return %g: <3 x f32>
}
"""


def loss(w, x):
    return dq.sum(dq.tanh(x @ w) * dq.sigmoid(x @ w))


def main() -> None:
    # 1. Symbolically: trace, differentiate with the e-graph's adjoint rules, and compare every
    #    gradient element with sympy.diff of the traced forward program, exactly.
    report = verify_gradient(loss, [(3,), (2, 3)], argnums=0)
    print(report)
    assert report.exact and report.elements == 3  # three gradient elements, all proven

    # 2. Numerically: central differences in float64 along a random direction, first order and
    #    (order=2) a Hessian-vector product through dq.grad of dq.grad.
    rng = np.random.default_rng(0)
    w, x = rng.standard_normal(3), rng.standard_normal((2, 3))
    checks = check_grads(loss, (w, x), order=2, argnums=0)
    for c in checks:
        print(f"order {c.order}: finite differences {c.numeric:.9f}, gradient {c.analytic:.9f}")
    assert [c.order for c in checks] == [1, 2]
    assert all(abs(c.numeric - c.analytic) <= 1e-5 * max(1, abs(c.numeric)) for c in checks)

    # 3. A hand-written adjoint, checked symbolically: the wrong sign is found, with the
    #    expected and computed expressions and a point where they differ.
    module = dq.parse(MODULE)
    try:
        dq.pipeline.verify_adjoint(module["f"], module["f_grad"], wrt=(0,), module=module)
    except VerificationError as e:
        symbolic = str(e)
    else:
        raise AssertionError("the wrong adjoint passed the symbolic check")
    print("symbolic check:", symbolic)
    assert "@f_grad" in symbolic and "is wrong" in symbolic and "expected" in symbolic

    # 4. ... and numerically: its directional derivative disagrees with finite differences.
    xs, ws = rng.standard_normal(3), rng.standard_normal(3)

    def forward(x):
        return dq.interpret(module, "f", x.astype(np.float32), ws.astype(np.float32))

    def hand_written(x):
        return dq.interpret(module, "f_grad", x.astype(np.float32), ws.astype(np.float32))

    try:
        check_vjp(forward, (xs,), hand_written, mode="grad", eps=1e-3, rtol=1e-3)
    except GradientCheckError as e:
        numeric = str(e)
    else:
        raise AssertionError("the wrong adjoint passed the numerical check")
    print("numerical check:", numeric)
    assert "disagrees with finite differences" in numeric

    # 5. The fix (1 - tanh^2) passes both checks; so does the compiler's own adjoint.
    fixed = dq.parse(MODULE.replace("%d = add 1: f32, %t2", "%d = subtract 1: f32, %t2"))
    ok = dq.pipeline.verify_adjoint(fixed["f"], fixed["f_grad"], wrt=(0,), module=fixed)
    print(ok)
    assert ok.exact
    check_vjp(
        lambda x: dq.interpret(fixed, "f", x.astype(np.float32), ws.astype(np.float32)),
        (xs,),
        lambda x: dq.interpret(fixed, "f_grad", x.astype(np.float32), ws.astype(np.float32)),
        mode="grad",
        eps=1e-3,
        rtol=1e-3,
    )


if __name__ == "__main__":
    main()
