"""Small kernels: the same map kernel (a 30-deep tanh chain) compiled as a small kernel (O2, no
vectorizers: codegen/cpu/llvm_cpu.is_small) and with the O3 vectorizing pipeline, called
alternately in one process; medians of the calling thread's CPU time per call (so that other
processes on a busy machine count less), and each pipeline's LLVM time.

    .venv/bin/python benchmarks/small_kernels.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dlvm_eq.codegen.cpu import llvm_cpu
from dlvm_eq.codegen.kernels.kernel_spec import KernelInput, KernelSpec
from dlvm_eq.codegen.kernels.spec import Load, unary
from dlvm_eq.codegen.runtime.cpu_kernel import CpuKernel

SIZES = (2, 3, 4, 6, 7, 8)
DEPTH = 30


def chain(n: int, dtype: str, tag: str) -> KernelSpec:
    x = Load(0)
    for _ in range(DEPTH):
        x = unary("tanh", x * x + x)
    return KernelSpec(f"chain_{tag}", (n,), [KernelInput(dtype)], [x])


def both(n: int, dtype: str) -> tuple[CpuKernel, CpuKernel, float, float]:
    """(small kernel, O3 kernel, LLVM seconds of each)."""
    spec = chain(n, dtype, "small")
    t0 = time.perf_counter()
    small = CpuKernel(spec)
    t_small = time.perf_counter() - t0
    real = llvm_cpu.is_small
    llvm_cpu.is_small = lambda spec: False  # the pipeline every kernel had before
    try:
        t0 = time.perf_counter()
        full = CpuKernel(chain(n, dtype, "o3"))
        t_full = time.perf_counter() - t0
    finally:
        llvm_cpu.is_small = real
    return small, full, t_small, t_full


def main() -> int:
    print("| n | dtype | small? | small kernel us/call | O3 us/call | LLVM ms small / O3 |")
    print("|---|---|---|---|---|---|")
    for n in SIZES:
        for dtype in ("f32", "f64"):
            small, full, c_small, c_full = both(n, dtype)
            a = np.linspace(-0.5, 0.5, n).astype("float32" if dtype == "f32" else "float64")
            assert np.array_equal(small(a), full(a))
            times: dict[str, list[float]] = {"small": [], "full": []}
            for _ in range(15):
                for name, k in (("small", small), ("full", full)):
                    t0 = time.thread_time()
                    for _ in range(2000):
                        k(a)
                    times[name].append((time.thread_time() - t0) / 2000 * 1e6)
            print(
                f"| {n} | {dtype} | {llvm_cpu.is_small(small.spec)} | "
                f"{statistics.median(times['small']):.2f} | {statistics.median(times['full']):.2f}"
                f" | {c_small * 1e3:.0f} / {c_full * 1e3:.0f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
