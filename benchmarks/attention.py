"""Attention (issue 33): softmax(q kᵀ / 8) v, 4 heads of dim 64, batch 1, float32, forward and
forward+backward, dlvm_eq against PyTorch's `scaled_dot_product_attention` (its CPU flash
kernel), PyTorch eager with the naive formula, torch.compile of the naive formula and JAX's
jit of it, side by side in one process.

    .venv/bin/python benchmarks/attention.py                          # seq 256 1024 4096
    .venv/bin/python benchmarks/attention.py --seq 256 1024 --update BENCHMARKS.md
    .venv/bin/python benchmarks/attention.py --threads 1 --update BENCHMARKS.md   # one core
    .venv/bin/python benchmarks/attention.py --threads 1 --clock cpu    # CPU time: a loaded host
    .venv/bin/python benchmarks/attention.py --pricing --threads 1 --clock cpu   # model vs measured
    .venv/bin/python benchmarks/attention.py --tiles 128x512 512x256 --threads 1 --clock cpu
                                   # the forward kernel under each tile, alternating call by call

From a git worktree, set PYTHONPATH to it: a script in benchmarks/ otherwise imports the
editable install's dlvm_eq (another tree's).

--threads N (default: every usable CPU) pins the process to N CPUs before numpy, OpenBLAS,
torch and dlvm_eq load, so that every implementation runs on N threads (torch is also told
N); its figures go in a section of their own.

dlvm_eq rows:
- "dlvm_eq (extraction's choice)": dq.jit as a user gets it; the note says which form
  extraction chose (rules/attention.egg put the fused `attention` op beside the plain program).
- "dlvm_eq fused kernel": the program with the one `attention` op that extraction produces
  where it prices the fused form lower, planned as is: the online-softmax kernel, never writing
  the seq x seq scores.
- "dlvm_eq plain": the traced program planned as written (no e-graph; for forward+backward
  the adjoint expanded from the primitives, not optimized, so no fused forward or backward).
In forward+backward, extraction's choice at seq >= 1024 is the fused forward and the fused
backward (codegen/runtime/attention_backward.py: dQ, dK, dV from the forward's row
log-sum-exp, never writing the scores).
Peak memory: the bytes of the program's arena (its temporaries, planned by liveness); the fused
kernel also holds one block of scores per thread outside it (the forward 512 x 256 floats,
the backward two of 128 x 512: ir/attention_op.py's shipped tiles).
Implementations take turns (three rounds, a few calls each, the first call of each turn not
counted), so a slow phase of the shared machine hits all alike; each figure is the median of
its calls.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import pin_threads, reexec_without

UNSET = reexec_without()  # before numpy loads OpenBLAS


PINNED = pin_threads(sys.argv)

import argparse  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from common import machine_line, markdown_table, update_section  # noqa: E402

import dlvm_eq as dq  # noqa: E402
from dlvm_eq.ir import FunctionBuilder, Module  # noqa: E402
from dlvm_eq.ir.types import DType, TensorType  # noqa: E402
from dlvm_eq.pipeline.native import compile as native_compile  # noqa: E402

SECTION = "## Attention: fused kernel derived by rules (issue 33)"
HEADS, DIM = 4, 64
ROUNDS = 3


def attn(q, k, v):
    return dq.softmax((q @ dq.transpose(k, (0, 1, 3, 2))) * 0.125, axis=-1) @ v


def loss(q, k, v, w):
    return dq.sum(attn(q, k, v) * w)


def _fused_module(q):
    """The program extraction gives where it takes the fused form: one `attention` op."""
    t = TensorType(q.shape, DType.f32)
    b = FunctionBuilder("attn", [t, t, t], ["q", "k", "v"])
    zero = b.const(0.0, DType.f32)
    m = Module("attn")
    m.add(b.finish(b.emit("attention", [*b.params, zero], scale=0.125, causal=0)))
    return m


def _fused_step_module(q):
    """value_and_grad of sum(o * w) as extraction gives it where it fuses both passes: one
    `attention` and the three `attentionBackward`s (one plan step)."""
    t = TensorType(q.shape, DType.f32)
    b = FunctionBuilder("step", [t, t, t, t], ["q", "k", "v", "w"])
    q_, k_, v_, w_ = b.params
    zero = b.const(0.0, DType.f32)
    o = b.emit("attention", [q_, k_, v_, zero], scale=0.125, causal=0)
    value = b.emit(
        "reduce", [b.emit("multiply", [o, w_])], combinator="add", init=0.0, axes=(0, 1, 2, 3)
    )
    grads = [
        b.emit("attentionBackward", [q_, k_, v_, zero, o, w_], scale=0.125, causal=0, wrt=i)
        for i in range(3)
    ]
    m = Module("step")
    m.add(b.finish([value, *grads]))
    return m


def _plain_step_module(args):
    """value_and_grad of sum(o * w) as the reverse pass writes it from the naive formula."""
    from dlvm_eq.ad.driver import adjoint_function

    fwd = dq.make_ir(loss)(*args)
    adj = adjoint_function(
        fwd, fwd["loss"], wrt=(0, 1, 2), keeping=(0,), tuple_result=True, optimize=False
    )
    module = Module("plain")
    module.add(adj)
    return module, adj.name


def pricing(seqs, calls: int, clock) -> list[list]:
    """[seq, program, form, measured ms, predicted ms] for the fused and the plain form of the
    forward and of forward + backward, each program planned as written (no e-graph) and priced
    by the cost model as written (egraph/optimize.program_cost): the figures
    tests/test_attention_pricing.py ranks the cost model against."""
    from dlvm_eq.egraph.optimize import program_cost

    rows = []
    for seq in seqs:
        rng = np.random.default_rng(0)
        args = [rng.standard_normal((1, HEADS, seq, DIM)).astype(np.float32) for _ in range(4)]
        plain_step, step_name = _plain_step_module(args)
        programs = {
            ("forward", "fused"): (_fused_module(args[0]), "attn", args[:3]),
            ("forward", "plain"): (dq.make_ir(attn)(*args[:3]), "attn", args[:3]),
            ("forward + backward", "fused"): (_fused_step_module(args[0]), "step", args),
            ("forward + backward", "plain"): (plain_step, step_name, args),
        }
        runs = {}
        for key, (module, name, call_args) in programs.items():
            compiled = native_compile(module, name, "cpu", optimize=False)
            runs[key] = lambda c=compiled, a=call_args: c(*a)
            runs[key]()
        times = {key: [] for key in runs}
        for _ in range(ROUNDS):
            for key, fn in runs.items():
                for i in range(1 + -(-calls // ROUNDS)):
                    t0 = clock()
                    fn()
                    if i:
                        times[key].append(clock() - t0)
        for key, (module, name, _) in programs.items():
            predicted = program_cost(module[name], module) * 1e3
            ms = statistics.median(times[key]) * 1e3
            rows.append([seq, *key, f"{ms:.2f}", f"{predicted:.3f}"])
            print(seq, *key, f"measured {ms:.2f} ms, predicted {predicted:.3f} ms")
    return rows


def tile_times(seqs, tiles, calls: int, clock) -> list[list]:
    """[seq, ms under each of `tiles`] of the fused forward kernel called directly
    (runtime/attention_cpu.attention_forward, one thread), the tiles taking turns call by call
    so that a slow phase of the shared machine hits all alike."""
    from dlvm_eq.codegen.runtime.attention_cpu import attention_forward

    rows = []
    for seq in seqs:
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((HEADS, seq, DIM), dtype=np.float32) for _ in range(3))
        o = np.empty_like(q)
        times: dict[tuple, list[float]] = {t: [] for t in tiles}
        for t in tiles:  # warm: the kernel compiled, the scratch made
            attention_forward(q, k, v, 0.0, 0.125, False, o, 1, t)
        for _ in range(ROUNDS * calls):
            for t in tiles:
                t0 = clock()
                attention_forward(q, k, v, 0.0, 0.125, False, o, 1, t)
                times[t].append(clock() - t0)
        rows.append([seq] + [f"{statistics.median(times[t]) * 1e3:.3f}" for t in tiles])
        print(*rows[-1])
    return rows


def _dlvm_rows(args, fwd_only: bool):
    """[(name, callable, arena bytes, note)] of the dlvm_eq implementations."""
    rows = []
    if fwd_only:
        module = dq.make_ir(attn)(*args[:3])
        call_args = args[:3]
        name = "attn"
    else:
        module = dq.make_ir(dq.value_and_grad(loss, argnums=(0, 1, 2)))(*args)
        call_args = args
        name = "loss"
    chosen = native_compile(module, name, "cpu")
    fused_chosen = "attention(" in str(chosen.plan)
    lines = [
        line.strip() for line in str(chosen.report).splitlines() if "attention e-class" in line
    ]
    note = ("fused" if fused_chosen else "plain") + " chosen" + (f"; {lines[0]}" if lines else "")
    rows.append(("dlvm_eq (extraction's choice)", chosen, chosen.plan.arena_bytes, note))
    if fwd_only:
        fused = native_compile(_fused_module(args[0]), "attn", "cpu", optimize=False)
        assert "attention(" in str(fused.plan)
        rows.append(("dlvm_eq fused kernel", fused, fused.plan.arena_bytes, "online softmax"))
    if not fwd_only:  # the adjoint of the naive forward, expanded and not optimized
        from dlvm_eq.ad.driver import adjoint_function

        fwd = dq.make_ir(loss)(*args)
        adj = adjoint_function(
            fwd, fwd["loss"], wrt=(0, 1, 2), keeping=(0,), tuple_result=True, optimize=False
        )
        module = Module("plain")
        module.add(adj)
        name = adj.name
    plain = native_compile(module, name, "cpu", optimize=False)
    rows.append(("dlvm_eq plain (no e-graph)", plain, plain.plan.arena_bytes, "as traced"))
    return [(n, (lambda c=c: c(*call_args)), b, note) for n, c, b, note in rows]


def _torch_rows(args, fwd_only: bool):
    try:
        import torch
    except ImportError:
        return []
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    F = torch.nn.functional
    q, k, v, w = (torch.from_numpy(a.copy()) for a in args)

    def sdpa():
        if fwd_only:
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v)
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(qq, kk, vv)
        (out * w).sum().backward()
        return qq.grad

    def naive():
        if fwd_only:
            with torch.no_grad():
                return torch.softmax(q @ k.transpose(-1, -2) * 0.125, -1) @ v
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        out = torch.softmax(qq @ kk.transpose(-1, -2) * 0.125, -1) @ vv
        (out * w).sum().backward()
        return qq.grad

    version = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    rows = [
        ("torch scaled_dot_product_attention", sdpa, None, version),
        ("torch eager, naive formula", naive, None, version),
    ]
    try:  # inductor's C++ kernels: needs a compiler; a failure leaves the row out
        formula = torch.compile(
            lambda a, b, c: torch.softmax(a @ b.transpose(-1, -2) * 0.125, -1) @ c
        )

        def compiled():
            if fwd_only:
                with torch.no_grad():
                    return formula(q, k, v)
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            (formula(qq, kk, vv) * w).sum().backward()
            return qq.grad

        compiled()
        rows.append(("torch.compile, naive formula", compiled, None, version))
    except Exception as e:  # a peer that cannot run here is reported and left out
        print("torch.compile left out:", type(e).__name__, str(e)[:200])
    return rows


def _jax_rows(args, fwd_only: bool):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return []
    q, k, v, w = (jnp.asarray(a) for a in args)

    def formula(a, b, c):
        return jax.nn.softmax(a @ jnp.swapaxes(b, -1, -2) * 0.125, axis=-1) @ c

    if fwd_only:
        f = jax.jit(formula)
        call = lambda: f(q, k, v).block_until_ready()
    else:
        g = jax.jit(jax.value_and_grad(lambda a, b, c: jnp.sum(formula(a, b, c) * w), (0, 1, 2)))
        call = lambda: jax.block_until_ready(g(q, k, v))
    return [("JAX jit, naive formula", call, None, f"jax {jax.__version__}")]


def _check(rows, args, fwd_only):
    """Every dlvm_eq row agrees with the float64 formula before it is timed."""
    q, k, v = (a.astype(np.float64) for a in args[:3])
    s = q @ np.swapaxes(k, -1, -2) * 0.125
    p = np.exp(s - s.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ v
    for name, fn, _, _ in rows:
        if not name.startswith("dlvm_eq"):
            continue
        out = fn()
        got = out if fwd_only else out[0]
        want = o if fwd_only else np.sum(o * args[3])
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3, err_msg=name)


def measure(seq: int, fwd_only: bool, calls: int, clock=time.perf_counter):
    rng = np.random.default_rng(0)
    shape = (1, HEADS, seq, DIM)
    args = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    rows = _dlvm_rows(args, fwd_only) + _torch_rows(args, fwd_only) + _jax_rows(args, fwd_only)
    _check(rows, args, fwd_only)
    times = {name: [] for name, *_ in rows}
    for name, fn, *_ in rows:  # warm up
        fn()
    # Rounds over the implementations, a few calls each, the first of each turn not counted:
    # thread pools that spin after a call (OpenBLAS's, torch's OpenMP workers, our pool) slow
    # whatever runs next on two cores, so a call right after another implementation's is not
    # its own figure.
    for _ in range(ROUNDS):
        for name, fn, *_ in rows:
            for i in range(1 + -(-calls // ROUNDS)):
                t0 = clock()
                fn()
                if i:
                    times[name].append(clock() - t0)
    return [
        (name, statistics.median(times[name]) * 1e3, arena, note) for name, _, arena, note in rows
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--calls", type=int, default=9)
    ap.add_argument("--update", type=Path)
    ap.add_argument("--threads", type=int, help="pin to this many CPUs (read before imports)")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the process's CPU time per call (with --threads 1, what other jobs on a "
        "shared machine do not inflate)",
    )
    ap.add_argument(
        "--pricing",
        action="store_true",
        help="time the fused and plain programs as written beside the cost model's predictions",
    )
    ap.add_argument(
        "--tiles",
        nargs="+",
        metavar="QxK",
        help="time the forward kernel under these (query block)x(key block) tiles instead",
    )
    a = ap.parse_args()
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    if a.tiles:
        tiles = [tuple(int(n) for n in t.split("x")) for t in a.tiles]
        table = tile_times(a.seq, tiles, a.calls, clock)
        print(
            markdown_table(["seq"] + [f"{t} ms" for t in a.tiles], table),
            f"\nload average {os.getloadavg()[0]:.1f}",
        )
        return
    if a.pricing:
        table = pricing(a.seq, a.calls, clock)
        print(
            markdown_table(["seq", "program", "form", "measured ms", "predicted ms"], table),
            f"\nload average {os.getloadavg()[0]:.1f}",
        )
        return
    out = []
    for fwd_only in (True, False):
        table = []
        for seq in a.seq:
            calls = max(3, a.calls // 3) if seq >= 4096 else a.calls
            for name, ms, arena, note in measure(seq, fwd_only, calls, clock):
                mib = f"{arena / 2**20:.1f}" if arena is not None else None
                table.append([seq, name, f"{ms:.2f}", mib, note])
                print(seq, "fwd" if fwd_only else "fwd+bwd", name, f"{ms:.2f} ms", mib, note)
        title = "Forward" if fwd_only else "Forward + backward (value_and_grad of sum(o * w))"
        out.append(
            f"### {title}\n\n"
            + markdown_table(["seq", "implementation", "median ms", "arena MiB", "note"], table)
        )
    threads = len(os.sched_getaffinity(0))
    section = SECTION if PINNED is None else f"{SECTION}, {threads} thread(s)"
    section += ", CPU time" if a.clock == "cpu" else ""
    flag = ("" if PINNED is None else f" --threads {PINNED}") + (
        " --clock cpu" * (a.clock == "cpu")
    )
    text = (
        f"{section}\n\n`benchmarks/attention.py --seq {' '.join(map(str, a.seq))}{flag}` "
        f"(batch 1, {HEADS} heads, head dim {DIM}, float32; medians of about {a.calls} calls' "
        f"{'CPU' if a.clock == 'cpu' else 'wall'} time "
        f"in {ROUNDS} rounds; {threads} CPU(s) for every implementation). Machine: "
        f"{machine_line()}; load average {os.getloadavg()[0]:.1f} "
        "at the end: the machine was shared with other jobs.\n\n" + "\n\n".join(out) + "\n"
    )
    print(text)
    if a.update:
        update_section(a.update, section, text)


if __name__ == "__main__":
    main()
