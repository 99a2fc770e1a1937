"""Batched float32 products through our GEMM (codegen/runtime/batch_gemm.py) against numpy's
matmul (a loop over the batch calling OpenBLAS per entry) and PyTorch's bmm-style matmul,
side by side in one run: the transformer encoder layer's attention products (batch 16, 4
heads, seq 128, head 64), forward and backward (transposed operands read in place), and a
broadcast one. Implementations take turns round by round (gemm.interleaved); medians.

    .venv/bin/python benchmarks/gemm_batched.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import reexec_without

UNSET = reexec_without()

import argparse  # noqa: E402

import numpy as np  # noqa: E402
from common import machine_line, markdown_table  # noqa: E402
from gemm import interleaved  # noqa: E402

B, H, T, D = 16, 4, 128, 64
CASES = [  # label, a's shape, b's shape, a transposed (last two axes), b transposed
    ("scores q @ k.T", (B, H, T, D), (B, H, T, D), False, True),
    ("context p @ v", (B, H, T, T), (B, H, T, D), False, False),
    ("grad p.T @ dc", (B, H, T, T), (B, H, T, D), True, False),
    ("grad dc @ v.T", (B, H, T, D), (B, H, T, D), False, True),
    ("broadcast x @ w[h]", (B, H, T, D), (1, H, D, D), False, False),
]


def operands(rng, sa, sb, ta, tb):
    a = rng.standard_normal(sa, dtype=np.float32)
    b = rng.standard_normal(sb, dtype=np.float32)
    return (np.swapaxes(a, -1, -2) if ta else a), (np.swapaxes(b, -1, -2) if tb else b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    from dlvm_eq.codegen.runtime import batch_gemm
    from dlvm_eq.codegen.runtime.cpu_count import usable_cpus

    rng = np.random.default_rng(0)
    rows = []
    for label, sa, sb, ta, tb in CASES:
        a, b = operands(rng, sa, sb, ta, tb)
        out = np.empty(
            np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), np.float32
        )
        if not batch_gemm.batch_matmul(a, b, out):
            raise SystemExit(
                f"{label}: batch_matmul declined it (DLVM_EQ_GEMM=0, or not an AVX2/AVX-512 host?)"
            )
        ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
        err = np.abs(out - ref).max() / np.abs(ref).max()
        if err > 1e-5:
            raise SystemExit(f"{label}: relative error {err:.2g}")
        impls = {
            "dlvm_eq batched GEMM": lambda: batch_gemm.batch_matmul(a, b, out),
            "numpy (OpenBLAS per entry)": lambda: np.matmul(a, b, out=out),
        }
        try:
            import torch

            torch.set_num_threads(usable_cpus())
            ta_, tb_, to_ = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
            impls[f"PyTorch {torch.__version__} matmul"] = lambda: torch.matmul(ta_, tb_, out=to_)
        except ImportError:
            pass
        t = interleaved(impls, args.rounds, args.reps)
        flops = 2 * out.size * a.shape[-1]
        base = t["numpy (OpenBLAS per entry)"]
        for name, s in t.items():
            rows.append(
                [label, name, f"{s * 1e3:.2f}", f"{flops / s / 1e9:.0f}", f"{s / base:.2f}x"]
            )
    print(machine_line())
    print(
        markdown_table(["product", "implementation", "median ms", "GFLOP/s", "time / numpy"], rows)
    )


if __name__ == "__main__":
    main()
