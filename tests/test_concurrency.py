"""Concurrent calls from many Python threads: every result right, 0 mismatches.

- the swapped GEMM path (a narrow product with a transposed A, computed as out.T = b.T @ a.T
  into a scratch matrix, then copied) from 4 threads: its scratch used to be shared per
  output shape, so a second thread overwrote it between another's product and its copy;
- 8 threads calling the SAME compiled programs (random hypothesis programs with every float32
  product through our GEMM, and programs built to reach the swapped and epilogue paths, row
  kernels and long reductions) many times each, against the float64 interpreter and bitwise
  against the program's single-threaded result.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from at_once import run_at_once
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_programs import random_function, random_inputs
from test_compile_differential import GEMM_KINDS, assert_close

from dlvm_eq import config
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.runtime import gemm_runtime
from dlvm_eq.ir import F32, Module, interpret
from dlvm_eq.pipeline import compile


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def test_swapped_narrow_products_from_four_threads():
    """a.T @ b with a (64, 512), b (64, 10): the swapped path (512x64 transposed A, 10 columns)."""
    rng = np.random.default_rng(0)
    pairs = [
        (
            rng.standard_normal((64, 512), dtype=np.float32),
            rng.standard_normal((64, 10), dtype=np.float32),
        )
        for _ in range(4)
    ]
    wants = []
    for a, b in pairs:
        out = np.empty((512, 10), np.float32)
        assert gemm_runtime.matmul(a.T, b, out)
        np.testing.assert_allclose(out, a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
        wants.append(out)
    assert (512, 10) in gemm_runtime._swap.scratch  # it took the swapped path
    bad = [0] * 4

    def work(i):
        a, b = pairs[i]
        for _ in range(1500):
            out = np.empty((512, 10), np.float32)
            gemm_runtime.matmul(a.T, b, out)
            bad[i] += not np.array_equal(out, wants[i])

    assert not run_at_once(work, 4)
    assert bad == [0] * 4, f"wrong results per thread: {bad}"


# ---------------------------------------------------------------- 8 threads, the same programs

THREADS = 8
SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _flat(x) -> list:
    """The arrays of a (possibly nested) tuple of results, in order."""
    if isinstance(x, tuple):
        return [a for item in x for a in _flat(item)]
    return [np.asarray(x)]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equal (every NaN alike: its sign and payload are not part of a result)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind != "f":
        return np.array_equal(a, b)
    ua, ub = (x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint64) for x in (a, b))
    return bool(((ua == ub) | (np.isnan(a) & np.isnan(b))).all())


def _close_to_interpreter(fn, got, args, rtol):
    m = Module("random")
    m.add(fn)
    assert_close(_tuple(got), _tuple(interpret(m, fn.name, *args, float64=True)), rtol, f"\n{fn}")


def _hammer(programs, reps: int) -> None:
    """THREADS threads call every (name, function, args, reference results) `reps` times, each
    in its own order; every result must be bitwise the reference (computed on one thread).
    Python switches threads every few microseconds meanwhile (not every 5 ms), so that a
    check-then-act on shared state that the GIL does not make atomic shows up within a run."""
    wrong: list = []

    def work(i):
        order = programs[i % len(programs) :] + programs[: i % len(programs)]
        for _ in range(reps):
            for name, f, args, ref in order:
                got = _flat(f(*args))
                if len(got) != len(ref) or not all(_same(g, r) for g, r in zip(got, ref)):
                    wrong.append((i, name))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(2e-6)
    try:
        errors = run_at_once(work, THREADS)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    assert not wrong, f"{len(wrong)} wrong results, e.g. {wrong[:5]}"


@settings(max_examples=10, **SETTINGS)
@given(st.data())
def test_eight_threads_call_the_same_random_programs(data):
    with pytest.MonkeyPatch.context() as m:
        # every float32 product, however small, through our GEMM (edge tiles, epilogues)
        m.setattr(gemm_runtime, "GEMM_MIN_MACS", 1)
        programs = []
        for i in range(3):
            n = data.draw(st.integers(3, 20))
            fn = random_function(data.draw, n_ops=n, dtype=F32, kinds=GEMM_KINDS, name=f"f{i}")
            module = Module("random")
            module.add(fn)
            f = compile(module, fn.name, optimize=False)
            for seed in (i, i + 100):  # other operands per call site (see below)
                args = random_inputs(fn, np.random.default_rng(seed))
                first = f(*args)
                _close_to_interpreter(fn, first, args, rtol=2e-6 * (1 + n / 4))
                programs.append((fn.name, f, args, [a.copy() for a in _flat(first)]))
        _hammer(programs, reps=25)


def test_eight_threads_call_the_same_gemm_row_and_reduction_programs():
    """Programs built to reach the swapped GEMM path, GEMM epilogues, row kernels and long
    reductions: the MLP training step (value_and_grad), a reduction-heavy program, and a
    lone swapped product."""
    from test_determinism import heavy, heavy_args

    import dlvm_eq as dq
    from dlvm_eq.models import mlp

    params = mlp.init_params([784, 256, 10], seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 784)).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
    step = dq.jit(dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3)))
    value, grads = step(*params, x, y)
    want_value, want_grads = mlp.numpy_value_and_grad(*params, x, y)
    assert float(value) == pytest.approx(float(want_value), rel=1e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * np.abs(w).max())
    assert step.report(*params, x, y).plan.epilogues
    h = dq.jit(heavy)
    hargs = heavy_args()
    swap = dq.jit(lambda a, b: dq.transpose(a) @ b)  # nothing to fuse: the swapped product alone
    programs = [
        ("mlp_step", step, [*params, x, y], [a.copy() for a in _flat(step(*params, x, y))]),
        ("heavy", h, hargs, [a.copy() for a in _flat(h(*hargs))]),
    ]
    # different operands per call site: threads computing the same product would hide a
    # shared scratch (they would write the same values into it)
    for i in range(20):
        sargs = [
            rng.standard_normal((64, 512)).astype(np.float32),
            rng.standard_normal((64, 10)).astype(np.float32),
        ]
        got = swap(*sargs)
        np.testing.assert_allclose(
            got, sargs[0].T.astype(np.float64) @ sargs[1], rtol=1e-4, atol=1e-4
        )
        programs.append((f"swapped{i}", swap, sargs, [got.copy()]))
    xs = [x * (1 + i / 8) for i in range(4)]
    programs += [
        (f"mlp_step{i}", step, [*params, xi, y], [a.copy() for a in _flat(step(*params, xi, y))])
        for i, xi in enumerate(xs)
    ]
    swapped = []
    real = gemm_runtime._swap_scratch
    with pytest.MonkeyPatch.context() as m:  # count the products that take the swapped path
        m.setattr(gemm_runtime, "_swap_scratch", lambda shape: swapped.append(shape) or real(shape))
        _hammer(programs, reps=6)
    assert swapped


# ---------------------------------------------------------------- compiling from threads


def test_compiles_in_other_threads_and_concurrent_first_calls(monkeypatch):
    """egglog's EGraph belongs to the thread that made it (used from another one it panics):
    a compile in a second thread, and 8 threads making the first call of one jitted function
    at once (8 compiles), all work and agree."""
    import dlvm_eq as dq

    monkeypatch.setenv("DLVM_EQ_NO_IR_CACHE", "1")  # really optimize and plan in each thread
    config.reload()  # (conftest re-reads the restored environment after the test)
    x = np.random.default_rng(5).standard_normal((64, 48)).astype(np.float32)
    w = np.random.default_rng(6).standard_normal((48, 40)).astype(np.float32)
    np.testing.assert_allclose(
        dq.jit(lambda x: dq.softmax(x * 2.0, axis=-1))(x),
        _softmax(x.astype(np.float64) * 2.0),
        rtol=1e-5,
        atol=1e-7,
    )
    got: list = []
    assert not run_at_once(
        lambda i: got.append(dq.jit(lambda x: dq.softmax(x + 1.0, axis=-1) * 3.0)(x)), 1
    )
    np.testing.assert_allclose(got[0], _softmax(x.astype(np.float64)) * 3.0, rtol=1e-5, atol=1e-7)

    f = dq.jit(lambda x, w: dq.softmax(dq.relu(x @ w), axis=-1) + dq.sum(x))
    results = [None] * THREADS

    def first_call(i):
        results[i] = f(x, w)

    assert not run_at_once(first_call, THREADS)
    want = _softmax(np.maximum(x.astype(np.float64) @ w, 0)) + x.astype(np.float64).sum()
    np.testing.assert_allclose(results[0], want, rtol=1e-5, atol=1e-4)
    assert all(_same(r, results[0]) for r in results)


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_output_buffers_are_never_handed_to_two_calls():
    """A tiny program from 8 threads, each with its own input, results held a moment: a
    dropped output buffer must go to one call only (the reference-count check and the
    hand-out are one step)."""
    import dlvm_eq as dq

    f = dq.jit(lambda x: x * 2.0 + 1.0)
    xs = [np.full(16, i, np.float32) for i in range(THREADS)]
    f(xs[0])
    wrong = [0] * THREADS

    def work(i):
        want = xs[i] * 2 + 1
        for _ in range(3000):
            y = f(xs[i])
            z = f(xs[i])  # two results alive at once: two buffers in use
            wrong[i] += not (np.array_equal(y, want) and np.array_equal(z, want))
            del y, z

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        errors = run_at_once(work, THREADS)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    assert wrong == [0] * THREADS, f"wrong results per thread: {wrong}"
