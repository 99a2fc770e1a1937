"""Deterministic numerics: a compiled kernel computes the same bits for the same input
whatever the element's position (vector body, vectorized epilogue or scalar remainder of a
loop), the thread count, or the load on the machine.

- every float unary op, the binary ops and fused chains: one value repeated, every sub-range
  [lo, hi) of many offsets and lengths 1..70 gives the bits that one element alone gives;
- row kernels (softmax, logsumexp, layernorm) on constant rows of lengths 1..70: every
  element of a row equal;
- reductions, row kernels and our GEMM with 1, 2, 3, 5 and 8 threads: bitwise equal; a whole
  reduction-heavy program (sums, means, softmax, products through our GEMM) with 1, 2 and 5
  threads, on one CPU (`taskset -c 0`) and while a busy process spins: bitwise equal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.kernels.kernel_spec import KernelInput, KernelSpec, ReduceSpec
from dlvm_eq.codegen.kernels.spec import DTYPES, UNARY_OPS, Load, binary, unary
from dlvm_eq.codegen.runtime.buffers import data_ptr
from dlvm_eq.codegen.runtime.cpu_kernel import CpuKernel

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _bits(a: np.ndarray) -> np.ndarray:
    """The bit patterns, every NaN as one pattern: a NaN's sign and payload are not results (x86
    propagates the first operand's NaN, and LLVM may commute a product's operands per width)."""
    a = np.asarray(a)
    bits = a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint64).copy()
    bits[np.isnan(a)] = np.asarray(np.nan, a.dtype).view(bits.dtype)
    return bits


# Values that reach every branch of the polynomial math: tiny, small (series), around the
# switch points (0.5, 0.625, 1), large (saturation, overflow), negative, special.
PROBES = [
    0.0,
    -0.0,
    1e-30,
    3e-4,
    0.1,
    -0.3,
    0.49,
    0.55,
    0.7,
    -1.5,
    2.5,
    7.0,
    9.4,
    9.6,
    15.0,
    25.0,
    -25.0,
    60.0,
    88.5,
    -100.0,
    700.0,
    np.inf,
    -np.inf,
    np.nan,
]
OFFSETS = [0, 1, 3, 7, 8, 13, 16]
SIZE = 96  # OFFSETS[-1] + 70 < SIZE


def _assert_position_independent(k: CpuKernel, dtype, probes=PROBES, n_in=1):
    """For each probe: the kernel on every [lo, lo + n) (n = 1..70) writes, at every element,
    the bits it writes for that value computed alone."""
    out = np.empty(SIZE, dtype)
    for p in probes:
        x = np.full(SIZE, p, dtype)
        ptrs = [data_ptr(out)] + [data_ptr(x)] * n_in + [k.dims_ptr]
        k.fn(0, 1, *ptrs)
        want = _bits(out)[0]
        for lo in OFFSETS:
            for n in range(1, 71):
                out.fill(np.nan)
                k.fn(lo, lo + n, *ptrs)
                got = _bits(out)[lo : lo + n]
                assert (got == want).all(), (
                    f"{k.spec.name} at {p!r} ({np.dtype(dtype).name}): [{lo}, {lo + n}) gives "
                    f"{out[lo : lo + n][got != want][:3]} at positions {np.flatnonzero(got != want)[:5] + lo}, "
                    f"alone {out.dtype.type(np.frombuffer(want.tobytes(), dtype)[0])}"
                )


FLOAT_UNARY = sorted(op for op, dts in UNARY_OPS.items() if "f32" in dts)


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("op", FLOAT_UNARY)
def test_unary_op_gives_the_same_bits_at_every_position(op, dt):
    spec = KernelSpec(f"u_{op}", (SIZE,), [KernelInput(dt)], [unary(op, Load(0))])
    _assert_position_independent(CpuKernel(spec, threads=1), DTYPES[dt])


FUSED = {
    "sigmoid_chain": lambda x: unary("sigmoid", x * 1.5 + 0.25) * x,
    "tanh_fma": lambda x: unary("tanh", x) * x + 1.0,
    "div": lambda x: binary("div", 1.0, x + 3.0),
    "pow": lambda x: binary("pow", unary("abs", x) + 0.5, x * 0.1),
    "exp_log": lambda x: unary("log", unary("exp", x * 0.01) + x * x),
    "softplus_expm1": lambda x: unary("softplus", x) - unary("expm1", x * 0.01),
    "rsqrt_sqrt": lambda x: unary("rsqrt", x * x + 1.0) + unary("sqrt", unary("abs", x)),
    "min_max": lambda x: binary("max", binary("min", x, 3.0), -2.0) * 0.5,
}


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_chain_gives_the_same_bits_at_every_position(name, dt):
    spec = KernelSpec(f"c_{name}", (SIZE,), [KernelInput(dt)], [FUSED[name](Load(0))])
    _assert_position_independent(CpuKernel(spec, threads=1), DTYPES[dt])


@pytest.mark.parametrize("n", [1, 4, 15, 16, 17, 20, 33, 64, 70])
def test_jitted_sigmoid_of_one_repeated_value_is_one_value(n):
    """The issue's example: dq.jit(dq.sigmoid) on np.full(20, 25) gave 16 x 1.0, 4 x 0.99999994."""
    for f in (dq.sigmoid, dq.exp, dq.tanh, dq.log):
        for v in (25.0, 0.3, 3.0):
            y = dq.jit(f)(np.full(n, v, np.float32))
            assert (_bits(y) == _bits(y)[0]).all(), (f.__name__, v, n, y)


@pytest.mark.parametrize("shape", [(5, 37), (3, 4, 21), (70, 3)])
def test_strided_and_broadcast_kernels_of_one_value_are_one_value(shape):
    """Multi-dimensional loops (an inner loop per row, carried into the outer dims) with a
    broadcast operand: every element alike."""
    f = dq.jit(lambda x, b: dq.sigmoid(x + b) * dq.exp(x * 0.5) - dq.tanh(b))
    x = np.full(shape, 0.0, np.float32)
    b = np.full(shape[-1:], 0.0, np.float32)  # sigmoid(0) = 0.5 exactly
    y = f(x, b)
    assert (_bits(y) == _bits(y).flat[0]).all(), np.unique(y)


def test_large_outputs_with_streaming_stores_are_one_value():
    """Large outputs go through L1 tiles and non-temporal stores (streaming.py) plus a plain
    loop for the rest, split over threads: every element alike all the same."""
    y = dq.jit(lambda x: dq.sigmoid(x * 1.5 + 0.25) * x)(np.full(3_000_017, 25.0, np.float32))
    assert (_bits(y) == _bits(y)[0]).all()


def test_gemm_epilogue_tiles_whole_and_partial_compute_alike():
    """A product whose every element is the same exact value (ones @ 0.25s), then a fused
    epilogue: whole 32-wide tiles (straight vector code) and edge tiles (a loop) agree."""
    f = dq.jit(lambda a, b: dq.sigmoid(a @ b - 16.0) * 3.0)  # sigmoid(0): 0.5 exactly
    a = np.ones((333, 64), np.float32)
    b = np.full((64, 77), 0.25, np.float32)
    y = f(a, b)
    assert f.report(a, b).plan.epilogues
    assert (_bits(y) == _bits(y)[0, 0]).all(), np.unique(y)


# ---------------------------------------------------------------- rows: every column alike

ROW_FNS = {
    "softmax": lambda x: dq.softmax(x, axis=-1),
    "logsumexp": lambda x: dq.logsumexp(x, axis=-1, keepdims=True) + x * 0.0,
    "gated_softmax": lambda x: dq.sigmoid(x) * dq.softmax(x, axis=-1),
    "layernorm": lambda x: (
        (x - dq.mean(x, axis=-1, keepdims=True))
        * dq.rsqrt(
            dq.mean(dq.square(x - dq.mean(x, axis=-1, keepdims=True)), axis=-1, keepdims=True)
            + 1e-5
        )
    ),
}


@pytest.mark.parametrize("name", sorted(ROW_FNS))
def test_row_kernel_columns_of_a_constant_row_are_equal(name):
    """Rows of one repeated value: every element of a row the same bits (the map pass's vector
    body and remainder, and the stashed exp values, compute alike)."""
    from dlvm_eq.codegen.planning.plan import RowStep

    f = dq.jit(ROW_FNS[name])
    for cols in (1, 3, 8, 10, 15, 16, 17, 31, 33, 40, 64, 70):
        x = np.repeat(np.array([[0.0], [25.0], [-7.0]], np.float32), cols, axis=1)
        y = f(x)
        for r in range(3):
            assert (_bits(y[r]) == _bits(y[r])[0]).all(), (name, cols, r, y[r])
        assert cols == 1 or any(isinstance(s, RowStep) for s in f.report(x).plan.steps)


# ---------------------------------------------------------------- thread counts

THREADS = [1, 2, 3, 5, 8]

REDUCTIONS = [  # (shape, axes): one long output, few long ones (both layouts), many short ones
    ((1 << 21,), (0,)),
    ((3, 700_001), (1,)),
    ((700_001, 3), (0,)),
    ((2000, 1000), (1,)),
    ((1000, 2000), (0,)),
    ((64, 300, 70), (0, 2)),
]


@pytest.mark.parametrize("op", ["add", "max"])
@pytest.mark.parametrize("shape, axes", REDUCTIONS)
def test_reductions_give_the_same_bits_with_any_thread_count(shape, axes, op):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    spec = ReduceSpec(
        "r", shape, [KernelInput("f32")], unary("exp", Load(0) * 0.1) * Load(0), op, axes
    )
    results = {t: CpuKernel(spec, threads=t)(x) for t in THREADS}
    want = np.exp(x.astype(np.float64) * 0.1) * x
    want = want.sum(axis=axes) if op == "add" else want.max(axis=axes)
    np.testing.assert_allclose(results[1], want, rtol=1e-4, atol=1e-3 * np.sqrt(x.size / want.size))
    for t, r in results.items():
        assert (_bits(r) == _bits(results[1])).all(), f"{t} threads differ from 1 thread"


def test_row_kernels_give_the_same_bits_with_any_thread_count():
    from dlvm_eq.codegen.kernels.rows import RowSpec
    from dlvm_eq.codegen.runtime.row_kernel import RowKernel

    x = np.random.default_rng(2).standard_normal((3000, 257)).astype(np.float32)
    v = Load(0)
    spec = RowSpec(
        "softmax",
        *x.shape,
        [KernelInput("f32")],
        [(v, "max", None), (unary("exp", v - Load(1)), "add", None)],
        [unary("exp", v - Load(1)) / Load(2)],
    )
    results = [RowKernel(spec, threads=t)(x) for t in THREADS]
    for r in results[1:]:
        for a, b in zip(r, results[0]):
            assert (_bits(a) == _bits(b)).all()


@pytest.mark.parametrize("narrow", [False, True])
def test_gemm_gives_the_same_bits_with_any_thread_count(narrow):
    """Blocks of C per thread; K is never split, so no element's sum depends on the split."""
    from dlvm_eq.codegen.runtime.gemm_runtime import BLOCKS_PER_THREAD, CpuGemm

    rng = np.random.default_rng(3)
    n = 16 if narrow else 300
    a = rng.standard_normal((700, 900), dtype=np.float32)
    b = rng.standard_normal((900, n), dtype=np.float32)
    outs = []
    for t in THREADS:
        g = CpuGemm(narrow, threads=t)
        assert t == 1 or 1 < len(g.blocks(700, n, 900)) <= BLOCKS_PER_THREAD * t  # really split
        out = np.empty((700, n), np.float32)
        g(a, b, out)
        outs.append(out)
    np.testing.assert_allclose(outs[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    for t, o in zip(THREADS, outs):
        assert (_bits(o) == _bits(outs[0])).all(), f"{t} threads"


# ---------------------------------------------------------------- whole programs


def heavy(x, w, b, d, v):
    """Reduction-heavy: products through our GEMM (plain, with a fused epilogue, and the swapped
    narrow one), softmax rows, sums and means over long axes."""
    h = dq.relu(x @ w + b)  # GEMM + epilogue
    p = dq.softmax(h, axis=-1)  # row kernel
    g = dq.transpose(x) @ d  # (784, 512) @ (512, 10): the swapped path
    return (
        h,
        p,
        g,
        dq.sum(x, axis=0),
        dq.mean(dq.exp(v * 0.01)),
        dq.sum(v.reshape(4, -1) ** 2, axis=1),
        dq.sum(x * x, axis=1),
        dq.max(dq.tanh(v)),
    )


def heavy_args():
    rng = np.random.default_rng(4)
    return [
        rng.standard_normal((512, 784)).astype(np.float32),
        (rng.standard_normal((784, 256)) * 0.05).astype(np.float32),
        rng.standard_normal(256).astype(np.float32),
        rng.standard_normal((512, 10)).astype(np.float32),
        rng.standard_normal(1 << 21).astype(np.float32),
    ]


def _digest(results) -> str:
    import hashlib

    h = hashlib.sha256()
    for r in results:
        h.update(_bits(np.ascontiguousarray(r)).tobytes())
    return h.hexdigest()


def _with_threads(monkeypatch, t: int):
    """What a process with `t` usable CPUs builds: every kernel and GEMM made afresh for t threads."""
    from dlvm_eq.codegen.runtime import cpu_kernel, gemm_runtime, row_kernel
    from dlvm_eq.codegen.runtime.kernel_memo import KernelMemo

    for mod in (cpu_kernel, row_kernel, gemm_runtime):
        monkeypatch.setattr(mod, "usable_cpus", lambda: t)
    monkeypatch.setattr(cpu_kernel, "_kernels", KernelMemo())
    monkeypatch.setattr(row_kernel, "_kernels", KernelMemo())
    monkeypatch.setattr(gemm_runtime, "_GEMMS", {})


def test_a_reduction_heavy_program_gives_the_same_bits_with_1_2_and_5_threads(monkeypatch):
    args = heavy_args()
    digests = {}
    for t in (1, 2, 5):
        with monkeypatch.context() as m:
            _with_threads(m, t)
            f = dq.jit(heavy)
            out = f(*args)
            assert f.report(*args).plan.epilogues  # the fused-epilogue path is taken
            digests[t] = _digest(out)
    assert len(set(digests.values())) == 1, digests


SCRIPT = """
import sys, numpy as np, dlvm_eq as dq
sys.path.insert(0, {tests!r})
from test_determinism import heavy, heavy_args, _digest
args = heavy_args()
f = dq.jit(heavy)
print(_digest(f(*args)))
"""


def _run(prefix=()) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [*prefix, sys.executable, "-c", SCRIPT.format(tests=str(ROOT / "tests"))],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_the_program_gives_the_same_bits_on_one_cpu_all_cpus_and_a_busy_machine():
    args = heavy_args()
    here = _digest(dq.jit(heavy)(*args))
    assert _run() == here
    if shutil.which("taskset") and len(os.sched_getaffinity(0)) > 1:
        assert _run(["taskset", "-c", str(min(os.sched_getaffinity(0)))]) == here
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # this session: same group
    try:
        assert _run() == here
    finally:
        busy.kill()
        busy.wait(timeout=60)
