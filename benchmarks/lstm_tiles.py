"""The LSTM step (benchmarks/rnn.py's value and gradient, batch 16) with its loop's packed-B
products on the wide AVX-512 tile (12 x 32, session 16) against the tile packed_b_gemm picks
by rows (8 x 32 for 16 rows: gemm_tiles.AVX512_SHORT), and nn.LSTM, in one process, calls
alternated, CPU ms a call (median). On AVX2 both programs run the same 6 x 16 tile.

    OPENBLAS_NUM_THREADS=1 DLVM_EQ_NUM_THREADS=1 python benchmarks/lstm_tiles.py --hidden 256 --steps 64
    OPENBLAS_NUM_THREADS=1 python benchmarks/lstm_tiles.py --products   # one product per tile, us
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import rnn  # noqa: E402

TILES = {
    "12x32": dict(mr=12, nr=32, kc=256, mc=288),
    "24x16": dict(mr=24, nr=16, kc=256, mc=144),
    "8x32": dict(mr=8, nr=32, kc=256, mc=288),
    "16x16": dict(mr=16, nr=16, kc=256, mc=288),
}


def products(rounds: int = 300) -> None:
    """The LSTM's two packed products (h @ U, dG @ U^T at hidden 256, batch 16) on a packed B
    through each AVX-512 tile, and OpenBLAS, alternated: us a call (median)."""
    import numpy as np

    from dlvm_eq.codegen.cpu.gemm_ir import B_PACKED
    from dlvm_eq.codegen.runtime.gemm_runtime import CpuGemm, pack_b_panels

    rng = np.random.default_rng(0)
    for m, k, n, bt in [(16, 256, 1024, False), (16, 1024, 256, True)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((n, k)).astype(np.float32).T if bt else None
        b = rng.standard_normal((k, n)).astype(np.float32) if b is None else b
        runs, keep = {}, []
        for name, tile in TILES.items():
            g = CpuGemm(threads=1, tile=tile)
            packed = pack_b_panels(b, g.spec.nr)
            scratch = np.empty(g.spec.scratch(n)[0], np.float32)
            out = np.empty((m, n), np.float32)
            flags = g.layout_flags("rows", k, False) | B_PACKED
            keep += [g, packed, scratch, out]  # the pointers below stay valid
            args = (0, m, 0, n, k, a.ctypes.data, k, 1, packed.ctypes.data, 0, 0)
            args += (out.ctypes.data, n, scratch.ctypes.data, None, flags, None, None)
            runs[name] = (lambda g, args: lambda: g._fn(*args))(g, args)
            runs[name]()
            np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-3)
        out = np.empty((m, n), np.float32)
        runs["openblas"] = lambda: np.matmul(a, b, out=out)
        t: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(rounds):
            for name, f in runs.items():
                c0 = time.process_time_ns()
                for _ in range(5):
                    f()
                t[name].append((time.process_time_ns() - c0) / 5e3)
        load = Path("/proc/loadavg").read_text().split()[0]
        cells = ", ".join(f"{k} {np.median(v):.1f}" for k, v in t.items())
        print(f"load {load} {m}x{k} @ {k}x{n}{' (B^T)' if bt else ''}: {cells} us")


def main() -> None:
    import numpy as np

    from dlvm_eq.codegen.execution import packed_products
    from dlvm_eq.codegen.runtime.gemm_runtime import packed_b_gemm, shared_gemm

    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--products", action="store_true", help="one product per tile (us)")
    a = ap.parse_args()
    if a.products:
        return products()
    args = rnn._data(a.steps, "lstm", a.hidden)
    progs = {}
    for name, pick in (("wide tile", lambda m: shared_gemm(False)), ("by rows", packed_b_gemm)):
        packed_products.packed_b_gemm = pick  # read when the loop's records are made
        progs[name] = rnn._dq_program("dq-scan", "lstm")
        progs[name](*args)
    packed_products.packed_b_gemm = packed_b_gemm
    import torch

    torch.set_num_threads(rnn.TORCH_THREADS)
    run = rnn._torch_program("torch-nn", "lstm", args)
    progs["nn.LSTM"] = lambda *_: run()
    times: dict[str, list[float]] = {k: [] for k in progs}
    for _ in range(a.rounds):
        for k, f in progs.items():
            c0 = time.process_time()
            f(*args)
            times[k].append(time.process_time() - c0)
    ms = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    load = Path("/proc/loadavg").read_text().split()[0]
    cells = ", ".join(f"{k} {v:.2f}" for k, v in ms.items())
    print(f"load {load} lstm {a.hidden} T={a.steps}: {cells} ms CPU a call")


if __name__ == "__main__":
    main()
