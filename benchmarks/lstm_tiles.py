"""The LSTM step (benchmarks/rnn.py's value and gradient, batch 16) with its loop's packed-B
products on the wide AVX-512 tile (12 x 32, session 16) against the tile packed_b_gemm picks
by rows (8 x 32 for 16 rows: gemm_tiles.AVX512_SHORT), and nn.LSTM, in one process, calls
alternated, CPU ms a call (median). On AVX2 both programs run the same 6 x 16 tile.

    OPENBLAS_NUM_THREADS=1 DLVM_EQ_NUM_THREADS=1 python benchmarks/lstm_tiles.py --hidden 256 --steps 64
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import rnn  # noqa: E402


def main() -> None:
    import numpy as np

    from dlvm_eq.codegen.execution import packed_products
    from dlvm_eq.codegen.runtime.gemm_runtime import packed_b_gemm, shared_gemm

    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=40)
    a = ap.parse_args()
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
