"""Our float32 GEMM (codegen/cpu/gemm_ir.py) against numpy's OpenBLAS and PyTorch's CPU matmul, side by
side in one run, on the MLP step's products and on squares; then a GEMM with its epilogue
(bias + ReLU + the ReLU mask, the MLP's first layer) against the product followed by the
kernel, with warm caches and with the caches flushed before each call.

    .venv/bin/python benchmarks/gemm.py                          # prints the tables
    .venv/bin/python benchmarks/gemm.py --update BENCHMARKS.md   # and writes its section

OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed (the script restarts itself without them).
Implementations take turns round by round; medians over all rounds. GFLOP/s = 2*m*n*k / time.
After each implementation's round the script sleeps 0.2 s: OpenBLAS and PyTorch keep their
worker threads spinning for up to ~100 ms after a call, which would otherwise slow whichever
implementation runs next; each round starts with one untimed call, so that workers that went
to sleep in the pause are awake (on this VM waking a sleeping thread takes 0.3-4 ms, which a
single product of a few ms would otherwise run without).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import reexec_without

UNSET = reexec_without()

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from common import machine_line, markdown_table, update_section  # noqa: E402

SECTION = "## GEMM (CPU, float32)"
SETTLE_S = 0.2
SHAPES = [  # (label, m, k, n, a transposed)
    ("MLP x @ w1", 256, 784, 256, False),
    ("MLP x.T @ dh", 784, 256, 256, True),
    ("MLP h @ w2 (10 wide)", 256, 256, 10, False),
    ("512^3", 512, 512, 512, False),
    ("1024^3", 1024, 1024, 1024, False),
    ("2048^3", 2048, 2048, 2048, False),
]


def operands(m, k, n, transposed, rng):
    a = rng.standard_normal((k, m) if transposed else (m, k), dtype=np.float32)
    return (a.T if transposed else a), rng.standard_normal((k, n), dtype=np.float32)


def implementations(a, b, out):
    from dlvm_eq.codegen.runtime import gemm_runtime

    impls = {}
    if gemm_runtime.matmul(a, b, out):  # False: it leaves this product to numpy
        impls["dlvm_eq GEMM"] = lambda: gemm_runtime.matmul(a, b, out)
    impls["numpy (OpenBLAS)"] = lambda: np.matmul(a, b, out=out)
    try:
        import torch

        from dlvm_eq.codegen.runtime.cpu_count import usable_cpus

        torch.set_num_threads(usable_cpus())
        ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
        impls[f"PyTorch {torch.__version__} mm"] = lambda: torch.mm(ta, tb, out=tout)
    except ImportError:
        pass
    return impls


def interleaved(impls: dict, rounds: int, reps: int, before=None) -> dict:
    """Median seconds per call of each implementation, taking turns round by round."""
    times = {name: [] for name in impls}
    for f in impls.values():
        f()
    for _ in range(rounds):
        for name, f in impls.items():
            f()  # untimed: worker threads asleep after the pause wake up (steady state)
            for _ in range(reps):
                if before is not None:
                    before()
                t0 = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
            time.sleep(SETTLE_S)
    return {name: statistics.median(ts) for name, ts in times.items()}


def gemm_table(rounds: int, reps: int) -> str:
    rng = np.random.default_rng(0)
    rows = []
    for label, m, k, n, tr in SHAPES:
        a, b = operands(m, k, n, tr, rng)
        out = np.empty((m, n), np.float32)
        ref = a.astype(np.float64) @ b
        impls = implementations(a, b, out)
        for name, f in impls.items():
            f()
            err = np.abs(out - ref).max() / np.abs(ref).max()
            if err > 1e-5:
                raise SystemExit(f"{name} on {label}: relative error {err:.2g}")
        big = m * n * k >= 1 << 30
        t = interleaved(
            impls, max(2, rounds // (2 if big else 1)), max(8, reps // (4 if big else 1))
        )
        base = t["numpy (OpenBLAS)"]
        for name, s in t.items():
            rows.append(
                [
                    label,
                    name,
                    f"{s * 1e6:.1f}",
                    f"{2 * m * n * k / s / 1e9:.0f}",
                    f"{s / base:.2f}x",
                ]
            )
    return markdown_table(
        ["product", "implementation", "median us", "GFLOP/s", "time / numpy"], rows
    )


def epilogue_table(rounds: int, reps: int) -> str:
    """x @ w1 then relu(. + b1) and the mask (. + b1) > 0, three ways, warm and cold."""
    from dlvm_eq.codegen.kernels.kernel_spec import KernelInput, KernelSpec
    from dlvm_eq.codegen.kernels.spec import Const, Load, binary, unary
    from dlvm_eq.codegen.runtime.buffers import data_ptr
    from dlvm_eq.codegen.runtime.cpu_kernel import compile_cpu
    from dlvm_eq.codegen.runtime.gemm_runtime import CpuEpilogue, CpuGemm

    rng = np.random.default_rng(1)
    rows = []
    for m, k, n in ((256, 784, 256), (1024, 1024, 1024)):
        x, w = operands(m, k, n, False, rng)
        bias = rng.standard_normal(n, dtype=np.float32)
        z = binary("add", Load(0), Load(1))
        spec = KernelSpec(
            "bias_relu_mask",
            (m, n),
            [KernelInput("f32"), KernelInput("f32", (0, 1))],
            [unary("relu", z), binary("gt", z, Const(0.0, "f32"))],
        )
        c, h = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
        mask = np.empty((m, n), bool)
        gemm, epilogue = CpuGemm(), CpuEpilogue(spec, 0)
        kernel = compile_cpu(spec)
        extra = [data_ptr(h), data_ptr(mask), data_ptr(c), data_ptr(bias)]

        def numpy_way():
            np.matmul(x, w, out=c)
            np.add(c, bias, out=c)
            np.greater(c, 0, out=mask)
            np.maximum(c, 0, out=h)

        impls = {
            "dlvm_eq GEMM + epilogue (fused)": lambda: gemm(
                x, w, c, epilogue=epilogue, extra=extra
            ),
            "dlvm_eq GEMM, then the kernel": lambda: (
                gemm(x, w, c),
                kernel(c, bias, out=(h, mask)),
            ),
            "numpy matmul, then add/greater/maximum": numpy_way,
        }
        want_h = np.maximum(x.astype(np.float64) @ w + bias, 0)
        for name, f in impls.items():
            h[:] = np.nan
            f()
            if np.abs(h - want_h).max() > 1e-4 * np.abs(want_h).max():
                raise SystemExit(f"{name}: wrong result")
        junk = np.ones(16 << 20, np.float32)  # 64 MiB: more than L2 + a share of L3

        def flush():
            np.add(junk, 1.0, out=junk)

        for state, before in (("warm", None), ("cold", flush)):
            t = interleaved(impls, rounds, reps, before)
            base = t["numpy matmul, then add/greater/maximum"]
            for name, s in t.items():
                rows.append(
                    [f"{m}x{k} @ {k}x{n}", state, name, f"{s * 1e6:.1f}", f"{s / base:.2f}x"]
                )
    return markdown_table(
        ["product", "caches", "implementation", "median us", "time / numpy"], rows
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--update", type=Path, help="write the section into this markdown file")
    args = ap.parse_args()
    env = (
        ("environment: " + ", ".join(UNSET) + " unset for this run")
        if UNSET
        else "environment: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE not set (nothing to unset)"
    )
    print(env)
    print("machine:", machine_line())
    g = gemm_table(args.rounds, args.reps)
    print(g)
    e = epilogue_table(args.rounds, args.reps)
    print(e)
    if args.update:
        text = "\n\n".join(
            [
                SECTION,
                f"Command: `.venv/bin/python benchmarks/gemm.py --update BENCHMARKS.md` ({env}). "
                f"Machine: {machine_line()}.",
                "Medians over interleaved rounds (0.2 s pause after each implementation's round, so that "
                "BLAS threads still spinning from one implementation do not slow the next).",
                g,
                "A GEMM with an epilogue (bias + ReLU + the ReLU mask, as in the MLP's first layer): "
                "warm = operands in cache from the previous call; cold = a 64 MiB array written "
                "between calls.",
                e,
            ]
        )
        update_section(args.update, SECTION, text)
        print(f"wrote {SECTION!r} into {args.update}")


if __name__ == "__main__":
    main()
