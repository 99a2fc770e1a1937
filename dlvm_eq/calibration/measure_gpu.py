"""The timings behind a GPU machine profile (`dlvm-eq calibrate --target gpu`): kernels of our
GPU code generator (PTX loaded through CuPy) and cuBLAS products through CuPy, each timed as a
compiled program runs it, the device synchronized around every timing (a launch returns at
once; the work finishes later).

    rates = gpu_rates(cp)          # bandwidth, flop rate, op classes, reductions, launch
    points = gpu_matmuls(cp)       # MatmulPoint per shape and layout

The measurements are those of `measure.py` (the same kernels: a streaming map, a chain of
multiply-adds and one map per op class beyond the copy-like one, timed by `measure.flop_rate`
and `measure.op_flops` themselves, a sum, a tiny launch), at sizes
for a data-centre GPU: STREAM_ELEMENTS is beyond an H100/H200's 50 MiB L2 and CACHED_ELEMENTS
fills every SM many times over while staying in it. Each figure is the fastest of several
timings (`measure.fastest_seconds`' reasoning: the least disturbed run).
"""

from __future__ import annotations

import math

import numpy as np

from ..codegen import KernelInput, KernelSpec, Load, ReduceSpec
from ..extract.profile import MatmulPoint
from .measure import LAYOUTS, fastest_seconds, flop_rate, op_flops, per_call

STREAM_ELEMENTS = 1 << 26  # 256 MiB of f32: beyond the L2
CACHED_ELEMENTS = 1 << 22  # 16 MiB: in the L2, thousands of blocks
# products: squares across sizes, transformer and MLP layer shapes, skinny and batched-like ones
MATMUL_SHAPES = [(m, m, m) for m in (128, 256, 512, 1024, 2048, 4096, 8192)] + [
    (4096, 1024, 4096),
    (4096, 4096, 1024),
    (1024, 4096, 4096),
    (8192, 512, 512),
    (512, 8192, 512),
    (16384, 256, 256),
    (256, 256, 16384),
    (8192, 64, 8192),
    (64, 8192, 64),
]
REPEATS = 7


def seconds_of(cp, fn, repeats: int | None = None, cap_s: float = 1.0, calls: int = 1) -> float:
    """Fastest seconds of one fn() (`measure.fastest_seconds` of batches of `calls`), each
    batch timed until the device is done with it; REPEATS timings unless told."""
    batch = per_call(fn, calls)
    sync = cp.cuda.runtime.deviceSynchronize

    def timed():
        batch()
        sync()

    return (
        fastest_seconds(timed, repeats=REPEATS if repeats is None else repeats, cap_s=cap_s) / calls
    )


def _map(name: str, n: int, body, inputs: int = 1):
    from ..codegen.gpu.gpu_runtime import compile_gpu

    return compile_gpu(KernelSpec(name, (n,), [KernelInput("f32")] * inputs, [body]))


def _beyond_copy(cp, name: str, body, inputs: int = 1) -> float:
    """Seconds per element a map of `body` takes beyond the copy-like map y = x + 1, on data
    in the L2, the two timed in turn."""
    n = CACHED_ELEMENTS
    xs = [cp.asarray(np.linspace(0.1, 2.0, n, dtype=np.float32)) for _ in range(inputs)]
    out = cp.empty(n, np.float32)
    k, copy = _map(f"calib_gpu_{name}", n, body, inputs), _map("calib_gpu_add", n, Load(0) + 1.0)
    t = c = math.inf
    for _ in range(3):
        t = min(t, seconds_of(cp, lambda: k(*xs, out=out), calls=10))
        c = min(c, seconds_of(cp, lambda: copy(xs[0], out=out), calls=10))
    return max(t - c, 0.0) / n


def gpu_rates(cp) -> dict:
    """bandwidth, flop_rate, op_flops, reduce_rate, launch (seconds) of the current device."""
    n = STREAM_ELEMENTS
    x, out = cp.asarray(np.ones(n, np.float32)), cp.empty(n, np.float32)
    stream = _map("calib_gpu_stream", n, Load(0) + 1.0)
    bandwidth = 2 * 4 * n / seconds_of(cp, lambda: stream(x, out=out))

    def beyond_copy(name, body, inputs=1):
        return _beyond_copy(cp, name, body, inputs)

    rate = flop_rate(beyond_copy)
    ops = op_flops(rate, beyond_copy)
    from ..codegen.gpu.gpu_runtime import compile_gpu

    total = compile_gpu(
        ReduceSpec("calib_gpu_sum", (n,), [KernelInput("f32")], Load(0), "add", (0,))
    )
    reduce_rate = n / seconds_of(cp, lambda: total(x))
    tiny_x, tiny_out = cp.asarray(np.ones(8, np.float32)), cp.empty(8, np.float32)
    tiny = _map("calib_gpu_tiny", 8, Load(0) + 1.0)
    launch = seconds_of(cp, lambda: tiny(tiny_x, out=tiny_out), calls=200)
    return {
        "bandwidth": bandwidth,
        "flop_rate": rate,
        "op_flops": ops,
        "reduce_rate": reduce_rate,
        "launch": launch,
    }


def gpu_matmuls(cp, shapes=None, layouts=LAYOUTS, cap_s: float = 0.3) -> list[MatmulPoint]:
    """Each product as GpuProgram runs a BlasStep (cp.matmul, cuBLAS), operands transposed as
    a layout flags, the fastest of two sweeps over the grid (seconds apart: a sweep another
    process disturbed is not the only one)."""
    rng = np.random.default_rng(0)
    runs = []
    for m, k, n in MATMUL_SHAPES if shapes is None else shapes:
        for ta, tb in layouts:
            a = cp.asarray(rng.random((k, m) if ta else (m, k), dtype=np.float32))
            b = cp.asarray(rng.random((n, k) if tb else (k, n), dtype=np.float32))
            a_op, b_op = (a.T if ta else a), (b.T if tb else b)
            out = cp.empty((m, n), np.float32)
            runs.append(
                (
                    (m, k, n, ta, tb),
                    lambda a_op=a_op, b_op=b_op, out=out: cp.matmul(a_op, b_op, out=out),
                )
            )
    best = [math.inf] * len(runs)
    for _ in range(2):
        best = [min(t, seconds_of(cp, run, cap_s=cap_s)) for t, (_, run) in zip(best, runs)]
    return [MatmulPoint(m, k, n, t, ta, tb) for ((m, k, n, ta, tb), _), t in zip(runs, best)]


__all__ = [
    "CACHED_ELEMENTS",
    "MATMUL_SHAPES",
    "STREAM_ELEMENTS",
    "gpu_matmuls",
    "gpu_rates",
    "seconds_of",
]
