"""Attention on a CUDA GPU, peers side by side in one run (issue 33): the fused PTX kernels
(codegen/gpu/attention_ptx.py, attention_backward_ptx.py) against the naive formula on CuPy
(it writes the seq x seq scores: what the gpu target's plain program does), and PyTorch's
`scaled_dot_product_attention` on CUDA where torch sees the device. Forward, and forward plus
backward (dQ, dK, dV), float32, head dim 64, medians of alternating rounds; and the error of
each against float64 numpy at the smallest seq.

    .venv/bin/python benchmarks/attention_gpu.py                      # seq 256 1024 4096
    .venv/bin/python benchmarks/attention_gpu.py --seq 1024 --out "$OUT/attention_gpu.md"

Run by scripts/gpu-check on a machine with a device; nothing here runs without one.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _fused(cp, q, k, v, bias, scale, causal):
    from dlvm_eq.codegen.gpu.attention_gpu import GpuAttentionKernel, attention_spec

    spec = attention_spec(q.shape, k.shape, v.shape, bias.shape, scale, causal, "f32")
    fwd = GpuAttentionKernel(spec)
    dq_k = GpuAttentionKernel(dataclasses.replace(spec, kernel="dq"))
    dkv_k = GpuAttentionKernel(dataclasses.replace(spec, kernel="dkv"))
    out, lse = cp.empty(q.shape, q.dtype), cp.empty(q.shape[:-1], q.dtype)
    grads = [cp.empty(a.shape, a.dtype) for a in (q, k, v)]
    delta = cp.empty(q.shape[:-1], q.dtype)

    def forward():
        fwd.run(out, lse, q, k, v, bias)
        return out

    def both(g):
        forward()
        dq_k.run_with(grads[0], delta, q, k, v, bias, out, g, lse)
        dkv_k.run_with(grads[1], grads[2], q, k, v, bias, g, lse, delta)
        return out, grads

    return forward, both


def _naive(cp, q, k, v, bias, scale, causal):
    n = k.shape[-2]
    hide = cp.asarray(np.triu(np.ones((q.shape[-2], n), bool), 1)) if causal else None

    def probs():
        s = cp.matmul(q, cp.swapaxes(k, -1, -2)) * scale + bias
        if hide is not None:
            s = cp.where(hide, -np.inf, s)
        s = cp.exp(s - s.max(-1, keepdims=True))
        return s / s.sum(-1, keepdims=True)

    def forward():
        return cp.matmul(probs(), v)

    def both(g):
        p = probs()
        o = cp.matmul(p, v)
        dv = cp.matmul(cp.swapaxes(p, -1, -2), g)
        dp = cp.matmul(g, cp.swapaxes(v, -1, -2))
        ds = p * (dp - (g * o).sum(-1, keepdims=True))
        return o, [cp.matmul(ds, k) * scale, cp.matmul(cp.swapaxes(ds, -1, -2), q) * scale, dv]

    return forward, both


def _torch(cp, q, k, v, bias, scale, causal):
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    t = [torch.as_tensor(a, device="cuda") for a in (q, k, v, bias)]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    mask = None if causal else t[3]  # SDPA takes a mask or is_causal; the causal rows use none

    def forward():
        return sdpa(t[0], t[1], t[2], attn_mask=mask, is_causal=causal, scale=scale)

    def both(g):
        x = [a.detach().requires_grad_() for a in t[:3]]
        o = sdpa(*x, attn_mask=mask, is_causal=causal, scale=scale)
        o.backward(torch.as_tensor(g, device="cuda"))
        return o, [a.grad for a in x]

    return forward, both


PEERS = {"fused PTX (ours)": _fused, "naive formula, CuPy": _naive, "torch SDPA": _torch}


def _reference(q, k, v, bias, g, scale, causal):
    from dlvm_eq.ir.attention_op import attention, attention_backward

    args = [np.asarray(a, np.float64) for a in (q, k, v, bias)]
    attrs = {"scale": scale, "causal": causal}
    o = attention(args, attrs)
    grads = [
        attention_backward([*args, o, np.asarray(g, np.float64)], {**attrs, "wrt": w})
        for w in range(3)
    ]
    return o, grads


def _host(cp, a):
    return a.detach().cpu().numpy() if hasattr(a, "detach") else cp.asnumpy(a)


def _time(cp, fns, rounds: int) -> list[float]:
    """Median ms of each function, the functions alternating within each round."""
    sync = cp.cuda.runtime.deviceSynchronize
    times: list[list[float]] = [[] for _ in fns]
    for f in fns:  # warm-up: kernels loaded, pools filled
        f()
    sync()
    for _ in range(rounds):
        for i, f in enumerate(fns):
            sync()
            t0 = time.perf_counter()
            f()
            sync()
            times[i].append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def main() -> int:
    from dlvm_eq.codegen.gpu.gpu_runtime import cupy_module

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None, help="also write the tables here")
    args = ap.parse_args()
    cp = cupy_module()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    lines = [
        f"Attention on {name} (compute capability {dev.compute_capability}), float32, batch "
        f"{args.batch}, {args.heads} heads, head dim {args.dim}; median ms of {args.rounds} "
        "alternating rounds; error: max |x - float64| / max |float64| over o, dQ, dK, dV "
        f"at seq {min(args.seq)}.",
        "",
        "| seq | causal | implementation | forward ms | fwd+bwd ms | error |",
        "|---|---|---|---|---|---|",
    ]
    rng = np.random.default_rng(0)
    status = 0
    for seq in sorted(args.seq):
        shape = (args.batch, args.heads, seq, args.dim)
        host = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
        pad = np.zeros((args.batch, 1, 1, seq), np.float32)
        pad[-1, ..., -seq // 8 :] = -np.inf  # the last batch item's last eighth of keys padded
        q, k, v, g = (cp.asarray(a) for a in host)
        scale = 1.0 / np.sqrt(args.dim)
        for causal in (False, True):
            bias = cp.asarray(np.zeros((), np.float32) if causal else pad)
            want = None
            if seq == min(args.seq):
                o64, g64 = _reference(*host[:3], cp.asnumpy(bias), host[3], scale, causal)
                want = [o64, *g64]
            runs = {}
            for label, make in PEERS.items():
                try:
                    runs[label] = make(cp, q, k, v, bias, scale, causal)
                except Exception as e:  # a peer that cannot run here: said, not hidden
                    lines.append(f"| {seq} | {causal} | {label} | not run: {e} | | |")
            fns = [f for pair in runs.values() for f in (pair[0], lambda b=pair[1]: b(g))]
            ms = _time(cp, fns, args.rounds)
            for i, (label, (_, both)) in enumerate(runs.items()):
                err = ""
                if want is not None:
                    o, grads = both(g)
                    got = [_host(cp, a) for a in (o, *grads)]
                    worst = max(
                        float(np.abs(x - w).max() / np.abs(w).max()) for x, w in zip(got, want)
                    )
                    err = f"{worst:.1e}"
                    if label.startswith("fused") and not worst < 1e-4:
                        status = 1
                lines.append(
                    f"| {seq} | {causal} | {label} | {ms[2 * i]:.3f} | {ms[2 * i + 1]:.3f} | {err} |"
                )
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
