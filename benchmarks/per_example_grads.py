"""Per-example gradients of the bundled MLP (784-256-10, batch 256) and the DP-SGD step built
on them: each example's gradient clipped to norm C (`optim.clip_by_global_norm` inside the
vmap, as JAX users write it), summed over the batch. Rows: the batched gradient; the DP-SGD
step with rules/per_example.egg (norms by Goodfellow's trick, the clipped sum as one GEMM) and
without it (the same program with the `perexample` ruleset left out of the schedule, in a
fresh process with an empty compile cache); dq.vmap(dq.grad) returning the per-example
gradients; a floor that only writes their bytes; JAX's jit(vmap(grad)) and its DP-SGD step;
torch.func's vmap(grad) DP-SGD step. One thread each.

    DLVM_EQ_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/per_example_grads.py

Per-example weight gradients are B times the parameters (205 MB of f32 for w1 at batch 256):
writing them, not the products, is what a per-example step that stores them costs over the
batched one. The row "write the gradients' bytes (floor)" fills just those arrays.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # this tree's dlvm_eq, not an installed one
sys.path[:0] = [str(ROOT)]

import numpy as np  # noqa: E402

import dlvm_eq as dq  # noqa: E402
from dlvm_eq.models import mlp  # noqa: E402

CLIP = 1.0  # C: every example's gradient is scaled to norm at most C
NUMS = (0, 1, 2, 3)


def fastest(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def data(batch: int):
    params = mlp.init_params([784, 256, 10], seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    onehot = np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)]
    return params, x, onehot


def dp_step(params, xs, ys):
    """The DP-SGD step as JAX users write it: vmap of (grad, clip), then sum."""

    def clipped_grad(params, x, y):
        g = dq.grad(lambda p: mlp.loss(*p, x, y))(params)
        return dq.optim.clip_by_global_norm(g, CLIP)

    per = dq.vmap(clipped_grad, in_axes=(None, 0, 0))(params, xs, ys)
    return dq.tree_map(lambda g: dq.sum(g, axis=0), per)


def dp_oracle(params, x, onehot):
    """float64 per-example loop (the hand-written backward pass), clipped, summed."""
    p64 = [p.astype(np.float64) for p in params]
    total = [np.zeros_like(p) for p in p64]
    for i in range(x.shape[0]):
        _, g = mlp.numpy_value_and_grad(*p64, x[i : i + 1].astype(np.float64), onehot[i : i + 1])
        scale = min(1.0, CLIP / np.sqrt(sum(np.sum(gi * gi) for gi in g)))
        total = [t + scale * gi for t, gi in zip(total, g)]
    return total


def check(got, want, what: str) -> None:
    for g, w in zip(got, want):
        err = np.abs(np.asarray(g, np.float64) - w).max()
        assert err <= 1e-4 * np.abs(w).max(), f"{what}: off by {err:.3g}"


def without_rules(batch: int, repeats: int) -> float:
    """This process: the DP-SGD step compiled with the `perexample` ruleset left out."""
    from dlvm_eq.egraph import optimize as egraph_optimize

    shipped = egraph_optimize.schedule_for

    def schedule_for(rules=()):
        s = shipped(rules)
        return type(s)(tuple(r for r in s.rulesets if r != "perexample"), s.step)

    egraph_optimize.schedule_for = schedule_for
    params, x, onehot = data(batch)
    step = dq.jit(dp_step)
    check(step(params, x, onehot), dp_oracle(params, x, onehot), "DP-SGD without the rules")
    return fastest(lambda: step(params, x, onehot), repeats)


def in_fresh_process(batch: int, repeats: int) -> float:
    with tempfile.TemporaryDirectory() as cache:
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env = dict(os.environ, DLVM_EQ_CACHE_DIR=cache, DLVM_EQ_NO_IR_CACHE="1", PYTHONPATH=path)
        cmd = [sys.executable, __file__, "--without-rules", "--batch", str(batch)]
        out = subprocess.run(
            cmd + ["--repeats", str(repeats)], env=env, capture_output=True, text=True
        )
    if out.returncode:
        raise SystemExit(f"the run without the rules failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def jax_rows(params, x, onehot, repeats: int) -> list[tuple[str, float]]:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return []

    def jloss(w1, b1, w2, b2, x, y):
        h = jnp.maximum(x @ w1 + b1, 0)
        return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(h @ w2 + b2), axis=-1))

    def jdp(params, xs, ys):
        def clipped(params, x, y):
            g = jax.grad(lambda p: jloss(*p, x, y))(params)
            norm = jnp.sqrt(sum(jnp.sum(t * t) for t in g))
            return [t * jnp.minimum(1.0, CLIP / norm) for t in g]

        return [t.sum(0) for t in jax.vmap(clipped, in_axes=(None, 0, 0))(params, xs, ys)]

    per = jax.jit(jax.vmap(jax.grad(jloss, argnums=NUMS), in_axes=(None,) * 4 + (0, 0)))
    step = jax.jit(jdp)
    jparams = [jnp.asarray(a) for a in params]
    jx, jy = jnp.asarray(x), jnp.asarray(onehot)
    check(step(jparams, jx, jy), dp_oracle(params, x, onehot), "JAX's DP-SGD step")
    return [
        (
            "jax.jit(jax.vmap(jax.grad))",
            fastest(lambda: jax.block_until_ready(per(*jparams, jx, jy)), repeats),
        ),
        (
            "JAX DP-SGD step (jit(vmap(grad)+clip+sum))",
            fastest(lambda: jax.block_until_ready(step(jparams, jx, jy)), repeats),
        ),
    ]


def torch_rows(params, x, onehot, repeats: int) -> list[tuple[str, float]]:
    try:
        import torch
        from torch.func import grad, vmap
    except ImportError:
        return []
    torch.set_num_threads(1)

    def tloss(p, x, y):
        h = torch.relu(x @ p[0] + p[1])
        return -(y * torch.log_softmax(h @ p[2] + p[3], -1)).sum(-1).mean()

    def tdp(p, xs, ys):
        g = vmap(grad(tloss), in_dims=(None, 0, 0))(p, xs, ys)
        norm = torch.sqrt(sum((t * t).flatten(1).sum(1) for t in g))
        scale = torch.clamp(CLIP / norm, max=1.0)
        return [(t * scale.reshape((-1,) + (1,) * (t.dim() - 1))).sum(0) for t in g]

    tp = [torch.from_numpy(p) for p in params]
    tx, ty = torch.from_numpy(x), torch.from_numpy(onehot)
    with torch.no_grad():
        check([t.numpy() for t in tdp(tp, tx, ty)], dp_oracle(params, x, onehot), "torch")
        return [
            (
                "torch.func DP-SGD step (vmap(grad)+clip+sum)",
                fastest(lambda: tdp(tp, tx, ty), repeats),
            )
        ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--without-rules", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.without_rules:
        print(json.dumps({"seconds": without_rules(args.batch, args.repeats)}))
        return
    params, x, onehot = data(args.batch)
    batched = dq.jit(dq.grad(mlp.loss, argnums=NUMS))
    step = dq.jit(dp_step)
    per_example = dq.jit(dq.vmap(dq.grad(mlp.loss, argnums=NUMS), in_axes=(None,) * 4 + (0, 0)))
    check(step(params, x, onehot), dp_oracle(params, x, onehot), "DP-SGD step")
    got = per_example(*params, x, onehot)
    want = batched(*params, x, onehot)  # the mean's gradient is the per-example mean
    assert np.allclose(np.mean(got[0], axis=0), want[0], atol=1e-4), "per-example grads"
    rows = [("dq.grad (batched)", fastest(lambda: batched(*params, x, onehot), args.repeats))]
    rows.append(("dq DP-SGD step", fastest(lambda: step(params, x, onehot), args.repeats)))
    rows.append(("dq DP-SGD step, no per_example.egg", in_fresh_process(args.batch, args.repeats)))
    rows.append(
        ("dq.vmap(dq.grad)", fastest(lambda: per_example(*params, x, onehot), args.repeats))
    )
    # the floor of a step that stores them: writing the per-example weight gradients' bytes
    # alone (w1's and w2's, into buffers reused as our arena is), with no arithmetic at all
    out1 = np.empty((args.batch, 784, 256), np.float32)
    out2 = np.empty((args.batch, 256, 10), np.float32)

    def write_only():
        out1.fill(1.0)
        out2.fill(1.0)

    rows.append(("write the gradients' bytes (floor)", fastest(write_only, args.repeats)))
    rows += jax_rows(params, x, onehot, args.repeats)
    rows += torch_rows(params, x, onehot, args.repeats)
    base = rows[0][1]
    for name, seconds in rows:
        print(f"{name:46s} {seconds * 1e3:9.2f} ms   {seconds / base:6.2f}x the batched gradient")


if __name__ == "__main__":
    main()
