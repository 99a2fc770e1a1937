"""Row-wise softmax of a 4096 x 4096 float32 matrix, side by side in one run: dq.jit (one fused
reduce-then-map row kernel) against a copy of the same bytes, numpy, and torch / jax where
importable; then the kernel build in a fresh process and a second one that finds the disk cache.

    .venv/bin/python benchmarks/softmax.py                        # CPU table
    .venv/bin/python benchmarks/softmax.py --update BENCHMARKS.md
    .venv/bin/python benchmarks/softmax.py --gpu                  # dq.jit(target="gpu") vs CuPy copy

"GB/s" counts the bytes a perfect kernel moves (read x once, write y once). Target (issue 5):
>= 0.7 of the copy's bandwidth.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import reexec_without

UNSET = reexec_without()

import argparse  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from common import machine_line  # noqa: E402
from elementwise import build_table, child_report, interleaved, table, wait_idle, write_subsection  # noqa: E402

SHAPE = (4096, 4096)


def softmax_dq(x):
    import dlvm_eq as dq

    return dq.softmax(x, axis=1)


def reference(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def cpu_cases(x):
    import dlvm_eq as dq

    f = dq.jit(softmax_dq)
    err = float(np.max(np.abs(f(x) - reference(x)) / (reference(x) + 1e-30)))
    if err > 2e-6:
        raise SystemExit(f"dq.jit softmax off by {err:.3g} relative")
    kernels = ", ".join(f.report(x).kernel_names)
    y = np.empty_like(x)

    def numpy_softmax():
        e = np.exp(x - x.max(axis=1, keepdims=True))
        e /= e.sum(axis=1, keepdims=True)
        return e

    cases = [
        {"name": "dq.jit", "fn": lambda: f(x), "note": f"{kernels}; max rel. error {err:.1e}"},
        {
            "name": "numpy copy (np.copyto)",
            "fn": lambda: np.copyto(y, x),
            "note": "bandwidth reference",
        },
        {"name": "numpy (max, exp, sum, divide in place)", "fn": numpy_softmax},
    ]
    try:
        import torch

        tx = torch.from_numpy(x)
        cases.append(
            {
                "name": "torch.softmax (eager)",
                "fn": lambda: torch.softmax(tx, dim=1),
                "note": f"torch {torch.__version__}",
            }
        )
        tc = torch.compile(lambda v: torch.softmax(v, dim=1))
        cases.append({"name": "torch.compile", "fn": lambda: tc(tx), "note": "inductor"})
    except ImportError:
        cases.append({"name": "torch", "timing": None, "note": "not installed"})
    try:
        import jax
        import jax.numpy as jnp

        jx = jnp.asarray(x)
        jf = jax.jit(lambda v: jax.nn.softmax(v, axis=1))
        cases.append(
            {
                "name": "jax.jit",
                "fn": lambda: jf(jx),
                "sync": jax.block_until_ready,
                "note": f"jax {jax.__version__}",
            }
        )
    except ImportError:
        cases.append({"name": "jax.jit", "timing": None, "note": "not installed"})
    return cases


def gpu_cases(x):
    import cupy as cp

    import dlvm_eq as dq

    gx = cp.asarray(x)
    f = dq.jit(softmax_dq, target="gpu")
    err = float(np.max(np.abs(cp.asnumpy(f(gx)) - reference(x)) / (reference(x) + 1e-30)))
    gy = cp.empty_like(gx)
    sync = lambda _: cp.cuda.Device().synchronize()
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = dev["name"].decode() if isinstance(dev["name"], bytes) else dev["name"]

    def cupy_softmax():
        e = cp.exp(gx - gx.max(axis=1, keepdims=True))
        e /= e.sum(axis=1, keepdims=True)
        return e

    return [
        {
            "name": "dq.jit(target='gpu')",
            "fn": lambda: f(gx),
            "sync": sync,
            "note": f"{', '.join(f.report(gx).kernel_names)}; max rel. error {err:.1e}",
        },
        {
            "name": "CuPy copy (cp.copyto)",
            "fn": lambda: cp.copyto(gy, gx),
            "sync": sync,
            "note": "bandwidth reference",
        },
        {"name": "CuPy eager", "fn": cupy_softmax, "sync": sync},
    ], name


def child(cache: str) -> None:
    os.environ["DLVM_EQ_CACHE_DIR"] = cache
    import dlvm_eq as dq

    x = np.random.default_rng(0).standard_normal(SHAPE, dtype=np.float32)
    child_report(dq.jit(softmax_dq), x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--wait-idle", type=float, default=0, metavar="S")
    p.add_argument("--update", metavar="BENCHMARKS.md")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child)
        return
    load = wait_idle(args.wait_idle) if args.wait_idle else f"load average {os.getloadavg()[0]:.2f}"
    x = np.random.default_rng(0).standard_normal(SHAPE, dtype=np.float32)
    if args.gpu:
        cases, device = gpu_cases(x)
        interleaved(cases, args.repeats * 4, args.rounds)
        text = (
            f"### GPU: row-wise softmax, 4096 x 4096 float32\n\n"
            f"Command: `scripts/gpu-check` (runs `benchmarks/softmax.py --gpu`)  \n"
            f"Device: {device}; {time.strftime('%Y-%m-%d')}\n\n"
            f"{table(cases, 2 * x.nbytes, 'CuPy copy (cp.copyto)', None)}\n"
        )
    else:
        cases = cpu_cases(x)
        interleaved(cases, args.repeats, args.rounds)
        text = (
            f"### Row-wise softmax, 4096 x 4096 float32 (CPU)\n\n"
            f"Command: `.venv/bin/python benchmarks/softmax.py --update BENCHMARKS.md`  \n"
            f"Machine: {machine_line()}; {time.strftime('%Y-%m-%d')}, {load}. "
            f"{args.rounds} rounds x {args.repeats} calls, implementations taking turns.\n\n"
            f"{table(cases, 2 * x.nbytes, 'numpy copy (np.copyto)', None)}\n\n"
            f"Target: dq.jit >= 0.7 of the copy's bandwidth. One row kernel: per row, the max, "
            f"then the sum of exp(x - max) (kept in a stack buffer), then the quotients; the row "
            f"is read from memory once (later passes hit L1/L2).\n\n"
            f"Kernel build (fresh processes; the second finds the kernel in the disk cache):\n\n"
            f"{build_table(__file__)}\n"
        )
    print(text)
    if args.update:
        write_subsection(Path(args.update), text)


if __name__ == "__main__":
    main()
