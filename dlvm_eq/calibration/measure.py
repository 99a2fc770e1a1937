"""The timings behind a machine profile, each a small compiled program run as compiled code
runs it: kernels through `compile_cpu` (the same JIT, thread split and pool), products through
the executor's matmul path (our GEMM where the host uses it, numpy's BLAS otherwise).

Every figure is the fastest of several repeats after one warm-up call (`fastest_seconds`: the
run least disturbed by other processes; medians of repeats were seen 2-30x off on this shared
2-core machine under a load of 5: a division priced 30 flops instead of 1, the pool's wake-up
173 us instead of 73), with a per-measurement time cap, so a whole calibration stays within its
budget on a busy machine (and is then noisier: the profile records when it was measured; run
it on a quiet machine).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from ..codegen import KernelInput, KernelSpec, Load, ReduceSpec, binary, compile_cpu, unary
from ..extract.profile import MatmulPoint
from ..ir.ops import OPS
from .block_choice import fastest_blocks, relative_score


# elementwise op classes timed one by one, from the registry's `measured_as` (ir/registry/):
# constructor of the op timed -> (its name, the constructors priced like it)
def _classes(arity: int) -> dict[str, tuple[str, tuple[str, ...]]]:
    out: dict[str, tuple[str, list[str]]] = {}
    for spec in OPS.values():
        if spec.arity == arity and spec.measured_as:
            timed = OPS[spec.measured_as]
            out.setdefault(timed.egg, (timed.name, []))[1].append(spec.egg)
    return {egg: (name, tuple(members)) for egg, (name, members) in out.items()}


OP_CLASSES = _classes(1)
BINARY_CLASSES = {egg: name for egg, (name, _) in _classes(2).items()}
SINH_COSH = ("Sinh", "Cosh")  # two exponentials and an add

# products measured: the MLP's and attention's shapes, squares across cache levels, skinny ones
MATMUL_SHAPES = [(m, m, m) for m in (16, 32, 64, 128, 256, 512, 1024)] + [
    (256, 784, 256),
    (256, 256, 10),
    (784, 256, 256),
    (256, 10, 256),
    (128, 64, 128),
    (2048, 256, 256),
    (64, 4096, 64),
    (4096, 64, 64),
    # matrix-vector and outer products (k = 1 is a broadcasting multiply, not BLAS),
    # and the long products of convolutions (O x C*9 x N*H*W)
    (1024, 128, 1),
    (128, 1024, 1),
    (1, 256, 256),
    (256, 1, 256),
    (1024, 1, 128),
    (32, 16, 8192),
    (64, 576, 2048),
    (576, 64, 2048),
]
LAYOUTS = ((False, False), (True, False), (False, True))
SLOWER_PER_FLOP = 4.0  # a product this much slower per flop than a smaller one is timed again

STREAM_ELEMENTS = 1 << 23  # 32 MiB of f32: beyond the last-level cache
CACHED_ELEMENTS = 1 << 14  # 64 KiB: inside L2 of every core
FMA_CHAIN = 16  # multiply-adds per element in the flop-rate kernel


def wall_times(fn: Callable[[], object], repeats: int = 9, cap_s: float = 1.0) -> list[float]:
    """Wall times of fn() over up to `repeats` runs after a warm-up, stopping early once
    `cap_s` is spent (at least 3 runs)."""
    fn()
    times, spent = [], 0.0
    while len(times) < repeats and (len(times) < 3 or spent < cap_s):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
    return times


def fastest_seconds(fn: Callable[[], object], repeats: int = 9, cap_s: float = 1.0) -> float:
    """Fastest of `wall_times`: on a machine others load, the run least disturbed (a median
    of 5 was seen 40x above the quiet time of a product while seven jobs shared two cores)."""
    return min(wall_times(fn, repeats, cap_s))


def per_call(fn: Callable[[], object], calls: int) -> Callable[[], None]:
    """fn repeated `calls` times: timing short calls in batches amortizes the timer."""

    def run():
        for _ in range(calls):
            fn()

    return run


def _map_kernel(name: str, n: int, body, inputs: int = 1):
    return compile_cpu(KernelSpec(name, (n,), [KernelInput("f32")] * inputs, [body]))


def bandwidth() -> float:
    """Bytes/s of a streaming map y = x + 1 over arrays beyond the cache (read + write)."""
    k = _map_kernel("calib_stream", STREAM_ELEMENTS, Load(0) + 1.0)
    x = np.ones(STREAM_ELEMENTS, np.float32)
    out = np.empty_like(x)
    t = fastest_seconds(lambda: k(x, out=out), repeats=5)
    return 2 * x.nbytes / t


def _cached_timer(name: str, body, inputs: int = 1) -> Callable[[], float]:
    """A function timing a map over cached data: its fastest seconds per element (many calls
    per timing)."""
    n = CACHED_ELEMENTS
    k = _map_kernel(f"calib_{name}", n, body, inputs)
    xs = [np.linspace(0.1, 2.0, n, dtype=np.float32) for _ in range(inputs)]
    out = np.empty(n, np.float32)
    calls = 50
    return lambda: fastest_seconds(per_call(lambda: k(*xs, out=out), calls)) / calls / n


def _beyond_copy(name: str, body, inputs: int = 1, rounds: int = 3) -> float:
    """Seconds per element a map of `body` takes beyond the copy-like kernel y = x + 1 (its
    call, loads and stores), each the fastest over `rounds` timings taken in turn: a small
    difference of two times, so both are taken in the same quiet moments (timed once each,
    exp came out at 6 flops in one calibration and 31 in the next under a load of 8)."""
    timed, copy = _cached_timer(name, body, inputs), _cached_timer("add", Load(0) + 1.0)
    t = c = math.inf
    for _ in range(rounds):
        t, c = min(t, timed()), min(c, copy())
    return t - c


def flop_rate(beyond_copy=None) -> float:
    """Elementwise flop/s of compiled code: a chain of FMA_CHAIN multiply-adds per element
    on cached data (2 flops each), beyond the copy-like kernel y = x + 1 (its call and its
    loads and stores: one call of the 16K-element map costs ~6.5 us here, which counted as
    compute would halve the rate, and plan_cost adds the call and the bytes separately).
    `beyond_copy(name, body, inputs=1)` times a kernel on another device (measure_gpu.py)."""
    x = Load(0)
    body = x
    for _ in range(FMA_CHAIN):
        body = body * 0.999 + 0.001
    return (2 * FMA_CHAIN - 1) / max((beyond_copy or _beyond_copy)("fma", body), 1e-13)


def op_flops(rate: float, beyond_copy=None) -> dict[str, float]:
    """Each op class's cost per element in flop equivalents at `rate`: its kernel's time per
    element on cached data, less that of the copy-like kernel around it (`beyond_copy`: as
    in flop_rate)."""
    beyond_copy = beyond_copy or _beyond_copy
    out: dict[str, float] = {}
    for op, (dlvm, members) in OP_CLASSES.items():
        t = beyond_copy(dlvm, unary(dlvm, Load(0)) + 1.0)
        for member in members:
            out[member] = max(1.0, t * rate)
    for op, dlvm in BINARY_CLASSES.items():
        out[op] = max(1.0, beyond_copy(dlvm, binary(dlvm, Load(0), Load(1)) + 1.0, inputs=2) * rate)
    for op in SINH_COSH:
        out[op] = 2 * out["Exp"] + 1
    return out


def reduce_rate() -> float:
    """Reduced elements/s of a sum over a large array (one output)."""
    n = STREAM_ELEMENTS
    k = compile_cpu(ReduceSpec("calib_sum", (n,), [KernelInput("f32")], Load(0), "add", (0,)))
    x = np.ones(n, np.float32)
    return n / fastest_seconds(lambda: k(x), repeats=5)


def launch_overheads() -> tuple[float, float]:
    """(seconds of one kernel call that runs on the calling thread, extra seconds when a call
    is big enough to split over the worker pool)."""
    tiny = _map_kernel("calib_tiny", 8, Load(0) + 1.0)
    x, out = np.ones(8, np.float32), np.empty(8, np.float32)
    calls = 2000
    launch = fastest_seconds(per_call(lambda: tiny(x, out=out), calls)) / calls
    # just above the size where work is split over threads vs just below: the difference, less
    # the extra elements' share, is what waking the pool costs
    from ..codegen.runtime.threads import MIN_PARALLEL_WORK

    below, above = MIN_PARALLEL_WORK - 64, 2 * MIN_PARALLEL_WORK
    ks = {n: _map_kernel(f"calib_split_{n}", n, Load(0) + 1.0) for n in (below, above)}
    bufs = {n: (np.ones(n, np.float32), np.empty(n, np.float32)) for n in ks}
    calls = 200
    t = {
        n: fastest_seconds(per_call(lambda n=n: ks[n](*bufs[n][:1], out=bufs[n][1]), calls)) / calls
        for n in ks
    }
    serial_above = t[below] * above / below
    return launch, max(0.0, t[above] - serial_above / 2)


def matmuls(
    shapes=MATMUL_SHAPES,
    layouts=LAYOUTS,
    cap_s: float = 0.3,
    passes: int = 2,
    retries: int = 3,
    between=(),
) -> list[MatmulPoint]:
    """Each product through the path compiled code takes: out = op(a) @ op(b); the fastest
    over `passes` sweeps of the whole grid, then up to `retries` more sweeps over the products
    still slower than a product at least as large. `between[i]` (other measurements) runs after
    sweep i: sweeps seconds apart do not all fall in one slow stretch of this VM (the fastest
    of 20 calls of a 128x64x128 product moved between 30 and 63 us from one second to the next;
    a calibration whose sweeps ran back to back priced attention's products 1.4x the fastest
    calls of the benchmark run after it). One sweep is not enough on a shared machine:
    OpenBLAS's second thread, its core taken by another process, holds every call of a product
    for whole scheduler ticks (128x64x128: 12 ms instead of 35 us, all 7 repeats, seen in
    three calibrations out of four under a load of 2), and that lasts about as long as one
    product's repeats; a later sweep, seconds on, finds the core again (under a load of 5, two
    sweeps still left 3-8 of the 69 products so slowed)."""
    from ..codegen.runtime.gemm_runtime import is_outer_product
    from ..codegen.runtime.gemm_runtime import matmul as executor_matmul

    rng = np.random.default_rng(0)
    runs = []
    for m, k, n in shapes:
        for ta, tb in layouts:
            a = rng.random((k, m) if ta else (m, k), dtype=np.float32)
            b = rng.random((n, k) if tb else (k, n), dtype=np.float32)
            a_op, b_op = (a.T if ta else a), (b.T if tb else b)
            out = np.empty((m, n), np.float32)

            def run(a_op=a_op, b_op=b_op, out=out):
                if is_outer_product(a_op.shape, b_op.shape):  # as the executor runs it
                    np.multiply(a_op, b_op, out=out)
                elif not executor_matmul(a_op, b_op, out):
                    np.matmul(a_op, b_op, out=out)

            calls = max(1, int(2e6 // (2 * m * k * n)) or 1)
            runs.append(((m, k, n, ta, tb), per_call(run, calls), calls))
    best = [math.inf] * len(runs)
    todo = list(range(len(runs)))
    for sweep in range(passes + retries):
        for i in todo:
            _, run, calls = runs[i]
            best[i] = min(best[i], fastest_seconds(run, repeats=7, cap_s=cap_s) / calls)
        if sweep < len(between):
            between[sweep]()
        if sweep + 1 >= passes:
            todo = _slower_than_a_larger([key for key, _, _ in runs], best)
            if not todo:
                break
    for later in between[sweep + 1 :]:  # fewer sweeps than measurements between them
        later()
    return [MatmulPoint(m, k, n, t, ta, tb) for ((m, k, n, ta, tb), _, _), t in zip(runs, best)]


def _slower_than_a_larger(keys, seconds) -> list[int]:
    """Indices of the products (m, k, n, trans_a, trans_b) that look disturbed against another
    of the same layout: slower than one at least as large in every dimension, or more than
    SLOWER_PER_FLOP times slower per flop than one at most as large in every dimension (a
    larger product runs at least as fast per flop, but for cache cliffs: 1024^3 ran at 44
    GFLOP/s where 512^3 ran at 125; 256x784x256 disturbed ran at 4, 256^3 at 90). Outer
    products (k = 1) are compared among themselves: they run as a multiply, without BLAS."""

    def disturbed(i):
        m, k, n, ta, tb = keys[i]
        for j, (qm, qk, qn, qa, qb) in enumerate(keys):
            if j == i or (qa, qb) != (ta, tb) or (qk == 1) != (k == 1):
                continue
            if qm >= m and qk >= k and qn >= n and seconds[j] < seconds[i]:
                return True
            if (
                qm <= m
                and qk <= k
                and qn <= n
                and seconds[i] / (m * k * n) > SLOWER_PER_FLOP * seconds[j] / (qm * qk * qn)
            ):
                return True
        return False

    return [i for i in range(len(keys)) if disturbed(i)]


# issue 36: the cache blockings (gemm_tiles.py's kc and mc) our GEMM is timed with; the shipped
# one is among them, so a profile only moves away from it where another measured faster
GEMM_BLOCKS = (
    {"kc": 256, "mc": 144},
    {"kc": 128, "mc": 96},
    {"kc": 256, "mc": 288},
    {"kc": 384, "mc": 144},
)
GEMM_BLOCK_SIZES = ((512, 512, 512), (2048, 256, 256))  # a square product, the MLP/transformer's


def gemm_blocks(candidates=GEMM_BLOCKS, sizes=GEMM_BLOCK_SIZES) -> dict[str, int]:
    """The blocking of `candidates` under which our GEMM (its wide micro-tile, one compiled
    kernel per candidate) runs the products `sizes` fastest (block_choice.fastest_blocks: the
    host's shipped blocks unless another is 3% faster over the sizes): the alternatives
    priced by measurement, the result kept in the profile (`gemm_blocks`)."""
    return gemm_block_choice(candidates, sizes)[0]


def gemm_block_choice(
    candidates=GEMM_BLOCKS, sizes=GEMM_BLOCK_SIZES
) -> tuple[dict[str, int], tuple[tuple[int, int, float], ...]]:
    """gemm_blocks's choice, and each candidate's time relative to the fastest ((kc, mc,
    relative), ..., the shipped blocking first): the profile's `gemm_block_times`, by which
    calibration/gemm_price.py prices our GEMM's products under the blocks in use."""
    from ..codegen.runtime.gemm_runtime import HOST_WIDE, CpuGemm
    from ..codegen.runtime.gemm_tiles import with_blocks

    rng = np.random.default_rng(0)
    ops = [
        (
            rng.standard_normal((m, k), dtype=np.float32),
            rng.standard_normal((k, n), dtype=np.float32),
            np.empty((m, n), np.float32),
        )
        for m, k, n in sizes
    ]
    shipped = {"kc": HOST_WIDE["kc"], "mc": HOST_WIDE["mc"]}  # first: kept unless beaten
    candidates = [shipped] + [dict(c) for c in candidates if dict(c) != shipped]
    timed = []
    for blocks in candidates:
        g = CpuGemm(tile=with_blocks(HOST_WIDE, blocks))
        timed.append(
            [
                fastest_seconds(lambda g=g, a=a, b=b, o=o: g(a, b, o), repeats=5, cap_s=0.5)
                for a, b, o in ops
            ]
        )
    rel = relative_score(timed)
    times = tuple((c["kc"], c["mc"], round(r, 4)) for c, r in zip(candidates, rel))
    return dict(candidates[fastest_blocks(timed)]), times


# issue 36: the convolutions' blockings (runtime/conv_cpu.py) timed at calibration; the shipped
# one is first, so a profile only moves away from it where another measured faster
CONV_BLOCKS = (
    {"chunk_bytes": 64 << 20, "per_image_macs": 1 << 18},
    {"chunk_bytes": 16 << 20, "per_image_macs": 1 << 18},
    {"chunk_bytes": 64 << 20, "per_image_macs": 1 << 16},
    {"chunk_bytes": 64 << 20, "per_image_macs": 1 << 20},
)
# (x shape, w shape, padding, groups): a CNN's first layer, a depthwise-separable block's
# pointwise-sized layer and a ResNet block's, where the candidates choose differently
CONV_BLOCK_SHAPES = (
    ((32, 1, 16, 16), (32, 1, 3, 3), 1, 1),
    ((8, 16, 16, 16), (16, 16, 3, 3), 1, 1),
    ((8, 32, 24, 24), (32, 32, 3, 3), 1, 1),
)


def conv_blocks(candidates=CONV_BLOCKS, shapes=CONV_BLOCK_SHAPES, cap_s=0.1) -> dict[str, int]:
    """The blocking of `candidates` under which the convolution and its two adjoints run on
    `shapes` fastest (each the fastest of a few calls; block_choice.fastest_blocks: the first,
    shipped, blocking unless another is 3% faster over the calls): the alternatives priced by
    measurement, the result kept in the profile (`conv_blocks`)."""
    from ..codegen.runtime import conv_blocks, conv_cpu

    rng = np.random.default_rng(0)

    def matmul(a, b, out):
        np.matmul(a, b, out=out)

    calls = []
    for xs, ws, pad, groups in shapes:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        attrs = dict(stride=(1, 1), padding=(pad,) * 4, dilation=(1, 1), groups=groups)
        dy = conv_cpu.evaluate("conv2d", (x, w), attrs, matmul)
        calls += [
            ("conv2d", (x, w), attrs),
            ("conv2dBackwardInput", (dy, w), {**attrs, "size": xs[2:]}),
            ("conv2dBackwardWeight", (x, dy), {**attrs, "size": ws[2:]}),
        ]
    timed = []
    before = dict(conv_blocks.BLOCKS)
    try:
        for blocks in candidates:
            conv_blocks.use_blocks(blocks)
            timed.append(
                [
                    fastest_seconds(
                        lambda op=op, args=args, attrs=attrs: conv_cpu.evaluate(
                            op, args, attrs, matmul
                        ),
                        repeats=5,
                        cap_s=cap_s,
                    )
                    for op, args, attrs in calls
                ]
            )
    finally:
        conv_blocks.use_blocks(before)
    return dict(candidates[fastest_blocks(timed)])
