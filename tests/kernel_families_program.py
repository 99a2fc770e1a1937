"""A CNN-like training step that reaches every native kernel family added for real models:
im2col/col2im (conv2d and its gradients), pools (max and average, forward and backward),
take/scatterAdd (an embedding lookup and its gradient), cumsum, and batched GEMM (attention-like
products), each big enough to be split over threads. Shared by the contention tests.

    >>> f = dq.jit(STEP); check_from_threads(f, want, threads=6, reps=3)
"""

from __future__ import annotations

import threading

import numpy as np

import dlvm_eq as dq


def loss(emb, c1, q, k, x, ids):
    e = dq.take(emb, ids, axis=0)  # take; its adjoint scatterAdd
    h = dq.max_pool2d(dq.relu(dq.conv2d(x, c1, padding=1)), 2)  # im2col + max pool; col2im
    a = dq.avg_pool2d(h, 2)
    s = dq.softmax(q @ dq.transpose(k, (0, 2, 1)), axis=-1)  # batched GEMM
    c = dq.cumsum(e, axis=0)
    return dq.sum(a * a) + dq.sum(dq.tanh(e) * c) * 1e-3 + dq.sum(s @ q)


STEP = dq.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))


def step_args(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((1000, 64)).astype(np.float32),
        (rng.standard_normal((16, 4, 3, 3)) * 0.2).astype(np.float32),
        rng.standard_normal((16, 64, 32)).astype(np.float32),
        rng.standard_normal((16, 64, 32)).astype(np.float32),
        rng.standard_normal((16, 4, 32, 32)).astype(np.float32),
        rng.integers(0, 1000, 2048).astype(np.int32),
    ]


def flat(v) -> list:
    if isinstance(v, (tuple, list)):
        return [a for e in v for a in flat(e)]
    return [np.asarray(v)]


def reference(args) -> list:
    """The interpreter's result on float64 copies of the inputs."""
    wide = [a.astype(np.float64) if a.dtype == np.float32 else a for a in args]
    return [a.astype(np.float64) for a in flat(dq.jit(STEP, target="interp")(*wide))]


def assert_close(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-3 * max(1.0, float(np.abs(w).max())))


def check_from_threads(f, args, want, threads: int, reps: int) -> list:
    """`threads` Python threads call f(*args) `reps` times each, together: every result close
    to `want` and bitwise equal to the first call's. Returns the errors (none expected)."""
    first = flat(f(*args))
    assert_close(first, want)
    errors: list = []
    barrier = threading.Barrier(threads)

    def work():
        try:
            barrier.wait(timeout=120)
            for _ in range(reps):
                got = flat(f(*args))
                for g, w in zip(got, first):
                    assert np.array_equal(g, w), "a concurrent call differs from the first call"
        except BaseException as e:
            errors.append(repr(e))

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=600)
    if any(t.is_alive() for t in pool):
        errors.append("a calling thread did not finish")
    return errors
