"""dq.optim (sgd, momentum, adam) against float64 numpy implementations of each update rule
over several steps: eagerly on numpy pytrees, inside dq.jit (interp and cpu), and as part of
a jitted value_and_grad training step on nested dict parameters."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq

RNG = np.random.default_rng(5)
STEPS = 4


class NumpySgd:
    def __init__(self, lr):
        self.lr = lr

    def init(self, params):
        return None

    def update(self, grads, state, params):
        return {k: params[k] - self.lr * grads[k] for k in params}, state


class NumpyMomentum:
    def __init__(self, lr, beta=0.9):
        self.lr, self.beta = lr, beta

    def init(self, params):
        return {k: np.zeros_like(v) for k, v in params.items()}

    def update(self, grads, velocity, params):
        velocity = {k: self.beta * velocity[k] + grads[k] for k in params}
        return {k: params[k] - self.lr * velocity[k] for k in params}, velocity


class NumpyAdam:
    def __init__(self, lr, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps

    def init(self, params):
        zeros = {k: np.zeros_like(v) for k, v in params.items()}
        return 0, zeros, dict(zeros)

    def update(self, grads, state, params):
        t, m, v = state
        t += 1
        m = {k: self.b1 * m[k] + (1 - self.b1) * grads[k] for k in params}
        v = {k: self.b2 * v[k] + (1 - self.b2) * grads[k] ** 2 for k in params}
        new = {
            k: params[k]
            - self.lr * (m[k] / (1 - self.b1**t)) / (np.sqrt(v[k] / (1 - self.b2**t)) + self.eps)
            for k in params
        }
        return new, (t, m, v)


CASES = [
    (lambda: dq.optim.sgd(0.1), lambda: NumpySgd(0.1)),
    (lambda: dq.optim.momentum(0.05, beta=0.8), lambda: NumpyMomentum(0.05, beta=0.8)),
    (lambda: dq.optim.adam(0.01), lambda: NumpyAdam(0.01)),
    (
        lambda: dq.optim.adam(0.1, b1=0.5, b2=0.9, eps=1e-3),
        lambda: NumpyAdam(0.1, b1=0.5, b2=0.9, eps=1e-3),
    ),
]
IDS = ["sgd", "momentum", "adam", "adam-options"]


def random_tree(dtype):
    return {
        "w": RNG.standard_normal((3, 2)).astype(dtype),
        "b": RNG.standard_normal(2).astype(dtype),
    }


def run(opt, ref, update, dtype):
    """STEPS updates with fresh random gradients; the parameters after each, ours and the
    reference's (which runs in float64)."""
    params = random_tree(dtype)
    ref_params = {k: v.astype(np.float64) for k, v in params.items()}
    state, ref_state = opt.init(params), ref.init(ref_params)
    for _ in range(STEPS):
        grads = random_tree(dtype)
        params, state = update(grads, state, params)
        ref_params, ref_state = ref.update(
            {k: v.astype(np.float64) for k, v in grads.items()}, ref_state, ref_params
        )
        yield params, ref_params


@pytest.mark.parametrize("make, make_ref", CASES, ids=IDS)
def test_eager_updates_match_float64_numpy(make, make_ref):
    opt = make()
    for params, expected in run(opt, make_ref(), opt.update, np.float64):
        for k in expected:
            np.testing.assert_allclose(params[k], expected[k], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("target", ["interp", "cpu"])
@pytest.mark.parametrize("make, make_ref", CASES, ids=IDS)
def test_jitted_updates_match_float64_numpy(make, make_ref, target):
    opt = make()
    update = dq.jit(opt.update, target=target)
    for params, expected in run(opt, make_ref(), update, np.float32):
        for k in expected:
            assert params[k].dtype == np.float32  # the state and parameters keep their dtype
            np.testing.assert_allclose(params[k], expected[k], rtol=2e-5, atol=2e-6)
    assert update.cache_size() == 1  # the state's structure stays the same


def test_state_is_a_pytree_of_arrays_with_the_parameters_structure():
    params = {"a": np.zeros(2, np.float32), "b": [np.zeros((1, 3))]}
    state = dq.optim.adam(1e-3).init(params)
    assert state.count.dtype == np.int32 and state.count.shape == ()
    assert dq.tree_structure(state.mu) == dq.tree_structure(params)
    assert [x.dtype for x in dq.tree_leaves(state.nu)] == [np.float32, np.float64]
    assert dq.tree_leaves(dq.optim.sgd(0.1).init(params)) == []


def test_jitted_training_step_with_adam_on_dict_params():
    """A 2-layer regression net: the jitted step (value_and_grad + adam) against numpy's
    backward pass and NumpyAdam, step by step; the loss falls."""
    x, y = RNG.standard_normal((16, 3)), RNG.standard_normal((16, 1))
    params = {"w1": RNG.standard_normal((3, 8)) * 0.5, "w2": RNG.standard_normal((8, 1)) * 0.5}

    def loss(p, x, y):
        return dq.mean(dq.square(dq.tanh(x @ p["w1"]) @ p["w2"] - y))

    def numpy_value_and_grad(p):
        h = np.tanh(x @ p["w1"])
        r = h @ p["w2"] - y
        d = 2 * r / r.size
        return np.mean(r**2), {"w1": x.T @ ((d @ p["w2"].T) * (1 - h * h)), "w2": h.T @ d}

    opt, ref = dq.optim.adam(0.05), NumpyAdam(0.05)

    @dq.jit(target="cpu")
    def step(p, state, x, y):
        value, grads = dq.value_and_grad(loss)(p, x, y)
        p, state = opt.update(grads, state, p)
        return p, state, value

    state, ref_params, ref_state, losses = opt.init(params), dict(params), ref.init(params), []
    for _ in range(8):
        params, state, value = step(params, state, x, y)
        ref_value, ref_grads = numpy_value_and_grad(ref_params)
        ref_params, ref_state = ref.update(ref_grads, ref_state, ref_params)
        np.testing.assert_allclose(value, ref_value, rtol=1e-10)
        for k in params:
            np.testing.assert_allclose(params[k], ref_params[k], rtol=1e-9, atol=1e-12)
        losses.append(float(value))
    assert int(state.count) == 8 and losses[-1] < 0.8 * losses[0]
