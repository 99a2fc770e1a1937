"""dq.optim's additions (issue 31): adamw, learning-rate schedules (optax's names and formulas)
and clip_by_global_norm, against float64 numpy written from the definitions, eagerly and inside
dq.jit on cpu and interp."""

from __future__ import annotations

import math

import numpy as np
import pytest
from vocab_checks import TARGETS

import dlvm_eq as dq

RNG = np.random.default_rng(7)
opt = dq.optim


def np_cosine(init, decay_steps, alpha, t):
    c = 0.5 * (1 + math.cos(math.pi * min(t, decay_steps) / decay_steps))
    return init * ((1 - alpha) * c + alpha)


def np_warmup_cosine(init, peak, warmup, decay, end, t):
    if t < warmup:
        return init + (peak - init) * t / warmup
    return np_cosine(peak, decay - warmup, end / peak, t - warmup)


SCHEDULES = {
    "constant": (opt.constant_schedule(0.3), lambda t: 0.3),
    "linear": (
        opt.linear_schedule(1.0, 0.1, 5, 2),
        lambda t: 1.0 - 0.9 * min(max(t - 2, 0), 5) / 5,
    ),
    "cosine": (opt.cosine_decay_schedule(0.5, 6, alpha=0.1), lambda t: np_cosine(0.5, 6, 0.1, t)),
    "warmup_cosine": (
        opt.warmup_cosine_decay_schedule(0.0, 1.0, 3, 9, end_value=0.05),
        lambda t: np_warmup_cosine(0.0, 1.0, 3, 9, 0.05, t),
    ),
    "exponential": (
        opt.exponential_decay(2.0, 4, 0.5, staircase=True),
        lambda t: 2.0 * 0.5 ** (t // 4),
    ),
    # optax's positional order: transition_begin before staircase
    "exponential_begin": (
        opt.exponential_decay(2.0, 4, 0.5, 3, False, 0.4),
        lambda t: max(2.0 * 0.5 ** (max(t - 3, 0) / 4), 0.4),
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedules_eagerly_and_on_a_traced_count(name):
    schedule, reference = SCHEDULES[name]
    counts = range(12)
    want = np.array([reference(t) for t in counts])
    eager = np.array([schedule(np.int32(t)) for t in counts], np.float64)
    np.testing.assert_allclose(eager, want, rtol=1e-6, atol=1e-7)
    traced = dq.jit(schedule, target="cpu")
    got = np.array([traced(np.array(t, np.int32)) for t in counts], np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def np_adamw(params, grads_seq, lr, b1=0.9, b2=0.999, eps=1e-8, wd=1e-4):
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    for t, grads in enumerate(grads_seq):
        rate = lr(t) if callable(lr) else lr
        for k in params:
            m[k] = b1 * m[k] + (1 - b1) * grads[k]
            v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
            step = (m[k] / (1 - b1 ** (t + 1))) / (np.sqrt(v[k] / (1 - b2 ** (t + 1))) + eps)
            params = {**params, k: params[k] - rate * (step + wd * params[k])}
    return params


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("scheduled", [False, True])
def test_adamw_over_several_steps_matches_numpy(target, scheduled):
    params = {"w": RNG.standard_normal((3, 4)), "b": RNG.standard_normal(4)}
    grads_seq = [{k: RNG.standard_normal(v.shape) for k, v in params.items()} for _ in range(5)]
    lr = SCHEDULES["warmup_cosine"][0] if scheduled else 0.05
    np_lr = SCHEDULES["warmup_cosine"][1] if scheduled else 0.05
    adamw = opt.adamw(lr, weight_decay=0.1)
    step = dq.jit(adamw.update, target=target)
    p, state = params, adamw.init(params)
    for grads in grads_seq:
        p, state = step(grads, state, p)
    want = np_adamw(params, grads_seq, np_lr, wd=0.1)
    for k in params:
        np.testing.assert_allclose(p[k], want[k], rtol=1e-6, atol=1e-7)
    assert int(state.count) == 5


@pytest.mark.parametrize("target", TARGETS)
def test_sgd_and_momentum_with_a_schedule_count_their_updates(target):
    params = {"w": RNG.standard_normal(3)}
    grads = {"w": RNG.standard_normal(3)}
    schedule, reference = SCHEDULES["cosine"]
    sgd = opt.sgd(schedule)
    state = sgd.init(params)
    assert isinstance(state, opt.ScheduleState) and int(state.count) == 0
    step = dq.jit(sgd.update, target=target)
    p = params
    for _ in range(3):
        p, state = step(grads, state, p)
    want = params["w"] - sum(reference(t) for t in range(3)) * grads["w"]
    np.testing.assert_allclose(p["w"], want, rtol=1e-6)
    assert int(state.count) == 3
    mom = opt.momentum(schedule, beta=0.5)
    p, state = dq.jit(mom.update, target=target)(grads, mom.init(params), params)
    np.testing.assert_allclose(p["w"], params["w"] - reference(0) * grads["w"], rtol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_by_global_norm(target, max_norm):
    grads = {"a": RNG.standard_normal((2, 3)), "b": [RNG.standard_normal(4)]}
    norm = math.sqrt(sum(np.sum(g**2) for g in (grads["a"], grads["b"][0])))
    scale = 1.0 if norm < max_norm else max_norm / norm
    got = dq.jit(lambda g: opt.clip_by_global_norm(g, max_norm), target=target)(grads)
    np.testing.assert_allclose(got["a"], grads["a"] * scale, rtol=1e-12)
    np.testing.assert_allclose(got["b"][0], grads["b"][0] * scale, rtol=1e-12)
    np.testing.assert_allclose(opt.global_norm(grads), norm, rtol=1e-12)
    eager = opt.clip_by_global_norm(grads, max_norm)
    np.testing.assert_allclose(eager["a"], grads["a"] * scale, rtol=1e-12)
