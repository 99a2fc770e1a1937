"""check_vjp / check_grads: central differences accept right gradients, catch wrong ones."""

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.pipeline import check_grads
from dlvm_eq.verify import GradientCheckError, check_vjp


def f(x, w):
    return np.sum(np.tanh(x @ w) * x[:, :1])


def grad_f(x, w):
    t = np.tanh(x @ w)
    d = (1 - t * t) * x[:, :1]
    gx = d @ w.T
    gx[:, 0] += t.sum(axis=1)
    return gx, x.T @ d


RNG = np.random.default_rng(3)
X, W = RNG.standard_normal((4, 3)), RNG.standard_normal((3, 2))


def test_check_vjp_accepts_a_right_gradient():
    result = check_vjp(f, (X, W), grad_f)
    assert abs(result.numeric - result.analytic) < 1e-7 * max(1.0, abs(result.numeric))


def test_check_vjp_catches_a_wrong_gradient():
    def wrong(x, w):
        gx, gw = grad_f(x, w)
        return gx, gw * 1.01

    with pytest.raises(GradientCheckError, match="finite differences"):
        check_vjp(f, (X, W), wrong)


def test_check_vjp_with_a_vjp_function_and_argnums():
    g = lambda x: np.sin(x) * x
    x = RNG.standard_normal(5)
    check_vjp(g, (x,), lambda ct: (ct * (np.cos(x) * x + np.sin(x)),), mode="vjp")
    with pytest.raises(GradientCheckError):
        check_vjp(g, (x,), lambda ct: (ct * np.cos(x) * x,), mode="vjp")
    check_vjp(f, (X, W), lambda x, w: grad_f(x, w)[1], argnums=1)


def _fd_grad(fn, argnums=0, h=1e-5):
    """A gradient transformation by fourth-order central differences (for testing the checker)."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    def g(*args):
        args = [np.asarray(a, dtype=np.float64) for a in args]
        out = []
        for i in nums:
            gi = np.zeros_like(args[i])
            for k in np.ndindex(args[i].shape):
                vals = []
                for step in (2 * h, h, -h, -2 * h):
                    a = [x.copy() for x in args]
                    a[i][k] += step
                    vals.append(float(fn(*a)))
                gi[k] = (-vals[0] + 8 * vals[1] - 8 * vals[2] + vals[3]) / (12 * h)
            out.append(gi)
        return out[0] if isinstance(argnums, int) else tuple(out)

    return g


def test_check_grads_order_two_recurses_through_the_gradient():
    checks = check_grads(f, (X, W), order=2, grad=_fd_grad, rtol=1e-4)
    assert [c.order for c in checks] == [1, 2]

    def sloppy(fn, argnums=0):  # right gradient, wrong second derivative
        g = _fd_grad(fn, argnums)
        if fn is f:
            return lambda *a: tuple(x + 1e-3 * np.sin(7 * a[0]).sum() for x in g(*a))
        return g

    with pytest.raises(GradientCheckError):
        check_grads(f, (X, W), order=2, grad=sloppy, rtol=1e-4)


def test_check_grads_of_dq_grad():
    def loss(x, w):
        return dq.sum(dq.tanh(x @ w) * dq.sigmoid(x @ w))

    checks = check_grads(loss, (X, W), order=2)
    assert len(checks) == 2
