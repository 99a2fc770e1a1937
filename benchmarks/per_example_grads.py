"""Per-example gradients (DP-SGD's pattern) of the bundled MLP (784-256-10, batch 256): the
batched gradient, dq.vmap of dq.grad (one batched program), and JAX's jit(vmap(grad)) on the
same machine, when JAX is installed.

    .venv/bin/python benchmarks/per_example_grads.py [--batch 256] [--repeats 20]

Per-example weight gradients are B times the parameters (205 MB of f32 for w1 at batch 256):
writing them, not the products, is what the per-example step costs over the batched one. The
row "write the gradients' bytes (floor)" fills just those arrays: a floor for any per-example
step on the machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import dlvm_eq as dq
from dlvm_eq.models import mlp


def fastest(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    params = mlp.init_params([784, 256, 10], seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 784)).astype(np.float32)
    onehot = np.eye(10, dtype=np.float32)[rng.integers(0, 10, args.batch)]
    nums = (0, 1, 2, 3)
    batched = dq.jit(dq.grad(mlp.loss, argnums=nums))
    per_example = dq.jit(dq.vmap(dq.grad(mlp.loss, argnums=nums), in_axes=(None,) * 4 + (0, 0)))
    rows = [("dq.grad (batched)", fastest(lambda: batched(*params, x, onehot), args.repeats))]
    rows.append(
        ("dq.vmap(dq.grad)", fastest(lambda: per_example(*params, x, onehot), args.repeats))
    )
    # the floor: writing the per-example weight gradients' bytes alone (w1's and w2's, filled
    # into buffers reused as our arena is), with no arithmetic at all
    out1 = np.empty((args.batch, 784, 256), np.float32)
    out2 = np.empty((args.batch, 256, 10), np.float32)

    def write_only():
        out1.fill(1.0)
        out2.fill(1.0)

    rows.append(("write the gradients' bytes (floor)", fastest(write_only, args.repeats)))
    got = per_example(*params, x, onehot)
    want = batched(*params, x, onehot)  # the mean's gradient is the per-example mean
    assert np.allclose(np.mean(got[0], axis=0), want[0] * 1.0, atol=1e-4), "per-example grads"
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        jax = None
    if jax is not None:

        def jloss(w1, b1, w2, b2, x, y):
            h = jnp.maximum(x @ w1 + b1, 0)
            return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(h @ w2 + b2), axis=-1))

        jfn = jax.jit(jax.vmap(jax.grad(jloss, argnums=nums), in_axes=(None,) * 4 + (0, 0)))
        jargs = [jnp.asarray(a) for a in (*params, x, onehot)]
        rows.append(
            (
                "jax.jit(jax.vmap(jax.grad))",
                fastest(lambda: jax.block_until_ready(jfn(*jargs)), args.repeats),
            )
        )
    base = rows[0][1]
    for name, seconds in rows:
        print(f"{name:36s} {seconds * 1e3:9.2f} ms   {seconds / base:6.2f}x the batched gradient")


if __name__ == "__main__":
    main()
