"""Small kernels: the same map kernel (a 30-deep tanh chain) compiled as a small kernel (math
routines called, the CLEANUP pipeline, no vectorizers: codegen/cpu/llvm_cpu.is_small) and as a
large one (math inlined, the O3 vectorizing pipeline), called alternately in one process;
medians of the calling thread's CPU time per call (so that other processes on a busy machine
count less), and LLVM's CPU time on each kernel's own IR through its own pipeline.

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


def both(n: int, dtype: str) -> tuple[CpuKernel, CpuKernel]:
    """(the kernel as a small kernel, the same kernel through the O3 vectorizing pipeline)."""
    small = CpuKernel(chain(n, dtype, "small"))
    real = llvm_cpu.is_small
    llvm_cpu.is_small = lambda spec: False  # the pipeline every kernel had before
    try:
        full = CpuKernel(chain(n, dtype, "o3"))
    finally:
        llvm_cpu.is_small = real
    return small, full


def llvm_ms(small: CpuKernel, full: CpuKernel, rounds: int = 3) -> tuple[float, float]:
    """CPU ms of LLVM on each kernel's IR through its pipeline: the small kernel's, and the
    large build's (O3 with the vectorizers)."""
    out = []
    # the IR each was built from (a fresh cache: built, not loaded), and its family's pipeline
    own = llvm_cpu.family_pipeline("small-map" if llvm_cpu.is_small(small.spec) else "map")
    for text, pipeline in (
        (small.ir.text, own),
        (full.ir.text, (3, True)),
    ):
        times = []
        for _ in range(rounds):
            t0 = time.thread_time()
            llvm_cpu.compile_object(text, pipeline[1], pipeline[0])
            times.append(time.thread_time() - t0)
        out.append(statistics.median(times) * 1e3)
    return out[0], out[1]


def main() -> int:
    print("| n | dtype | small? | small kernel us/call | O3 us/call | LLVM ms small / O3 |")
    print("|---|---|---|---|---|---|")
    for n in SIZES:
        for dtype in ("f32", "f64"):
            small, full = both(n, dtype)
            c_small, c_full = llvm_ms(small, full)
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
                f" | {c_small:.0f} / {c_full:.0f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
