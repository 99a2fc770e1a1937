"""Training steps of real models, side by side in one run: dlvm_eq against PyTorch eager,
torch.compile and JAX jit, with every implementation's gradients checked against a float64
PyTorch reference before anything is timed; plus dlvm_eq's cold and warm compile times.

    .venv/bin/python benchmarks/models.py                          # both models, prints the tables
    .venv/bin/python benchmarks/models.py --only cnn --rounds 3    # one model, fewer rounds
    .venv/bin/python benchmarks/models.py --update BENCHMARKS.md   # and writes its section
    .venv/bin/python benchmarks/models.py --threads 1 --clock cpu  # one core, CPU time: a loaded host

| model | configuration |
|---|---|
| CNN | batch 128 on 1x28x28: conv 3x3 32 (pad 1), ReLU, max-pool 2, conv 3x3 64 (pad 1), ReLU, max-pool 2, dense 10, mean softmax cross-entropy |
| transformer encoder layer | batch 16, seq 128, d_model 256, 4 heads, MLP 1024 (GELU, tanh form), post-norm, mean squared error, f32 |

A step is value and gradient plus an SGD update of every parameter, each implementation in its
own idiom (JAX and dlvm_eq: the update inside the jitted function; PyTorch: optim.SGD).
Step times are medians over --rounds x --steps steps after warm-up, the implementations taking
turns round by round. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed (the script restarts
itself without them), as in the other benchmarks. Peers come from the `bench` extra; a missing
one is noted and skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import pin_threads, reexec_without

UNSET = reexec_without()
PINNED = pin_threads(sys.argv)  # before numpy, torch and JAX size their pools

import argparse  # noqa: E402
import datetime  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402
from common import Timing, machine_line, timing_table, update_section  # noqa: E402

SECTION = "## Model training steps (CNN, transformer encoder layer)"
LR = 0.01
BASELINE = "dlvm_eq"


# ---------------------------------------------------------------- the models, as data


class CNN:
    name = "cnn"
    title = "CNN, batch 128, 1x28x28: conv3x3 32, pool, conv3x3 64, pool, dense 10"
    BATCH = 128

    @staticmethod
    def params(seed=0):
        rng = np.random.default_rng(seed)
        he = lambda *s: (rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:]))).astype(np.float32)
        return {
            "c1": he(32, 1, 3, 3),
            "b1": np.zeros(32, np.float32),
            "c2": he(64, 32, 3, 3),
            "b2": np.zeros(64, np.float32),
            "w": (rng.standard_normal((64 * 7 * 7, 10)) * 0.01).astype(np.float32),
            "b": np.zeros(10, np.float32),
        }

    @classmethod
    def data(cls, seed=0):
        rng = np.random.default_rng(seed + 1)
        x = rng.random((cls.BATCH, 1, 28, 28), dtype=np.float32)
        y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, cls.BATCH)]
        return x, y

    @staticmethod
    def loss(F, p, x, y):
        """The model in any of the frameworks: F supplies conv2d, max_pool2d, relu,
        log_softmax, reshape, mean, sum."""
        h = F.max_pool2d(F.relu(F.conv2d(x, p["c1"], 1) + F.channel(p["b1"])), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, p["c2"], 1) + F.channel(p["b2"])), 2)
        logits = F.reshape(h, (h.shape[0], 64 * 7 * 7)) @ p["w"] + p["b"]
        return -F.mean(F.sum(y * F.log_softmax(logits), 1))


class Transformer:
    name = "transformer"
    title = "transformer encoder layer, batch 16, seq 128, d_model 256, 4 heads, MLP 1024"
    B, T, D, H, FF = 16, 128, 256, 4, 1024

    @classmethod
    def params(cls, seed=0):
        rng = np.random.default_rng(seed)
        w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
        D, FF = cls.D, cls.FF
        return {
            "wq": w(D, D),
            "wk": w(D, D),
            "wv": w(D, D),
            "wo": w(D, D),
            "w1": w(D, FF),
            "b1": np.zeros(FF, np.float32),
            "w2": w(FF, D),
            "b2": np.zeros(D, np.float32),
            "g1": np.ones(D, np.float32),
            "be1": np.zeros(D, np.float32),
            "g2": np.ones(D, np.float32),
            "be2": np.zeros(D, np.float32),
        }

    @classmethod
    def data(cls, seed=0):
        rng = np.random.default_rng(seed + 1)
        x = rng.standard_normal((cls.B, cls.T, cls.D)).astype(np.float32)
        y = rng.standard_normal((cls.B, cls.T, cls.D)).astype(np.float32)
        return x, y

    @classmethod
    def loss(cls, F, p, x, y):
        B, T, D, H = cls.B, cls.T, cls.D, cls.H
        hd = D // H

        def heads(t):  # (B, T, D) -> (B, H, T, hd)
            return F.transpose(F.reshape(t, (B, T, H, hd)), (0, 2, 1, 3))

        q, k, v = heads(x @ p["wq"]), heads(x @ p["wk"]), heads(x @ p["wv"])
        scores = (q @ F.transpose(k, (0, 1, 3, 2))) * (1.0 / np.sqrt(hd))
        attn = F.softmax(scores)
        ctx = F.reshape(F.transpose(attn @ v, (0, 2, 1, 3)), (B, T, D))
        h = F.layer_norm(x + ctx @ p["wo"], p["g1"], p["be1"])
        out = F.layer_norm(h + F.gelu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"], p["g2"], p["be2"])
        return F.mean((out - y) * (out - y))


MODELS = {"cnn": CNN, "transformer": Transformer}


# ---------------------------------------------------------------- the frameworks' vocabularies


class TorchOps:
    def __init__(self):
        import torch
        import torch.nn.functional as tf

        self.t, self.f = torch, tf

    def conv2d(self, x, w, padding):
        return self.f.conv2d(x, w, padding=padding)

    def max_pool2d(self, x, k):
        return self.f.max_pool2d(x, k)

    def relu(self, x):
        return self.t.relu(x)

    def channel(self, b):
        return b.reshape(1, -1, 1, 1)

    def reshape(self, x, s):
        return x.reshape(s)

    def transpose(self, x, axes):
        return x.permute(*axes)

    def log_softmax(self, x):
        return self.f.log_softmax(x, dim=-1)

    def softmax(self, x):
        return self.t.softmax(x, dim=-1)

    def mean(self, x):
        return x.mean()

    def sum(self, x, axis):
        return x.sum(axis)

    def gelu(self, x):
        return self.f.gelu(x, approximate="tanh")

    def layer_norm(self, x, g, b):
        return self.f.layer_norm(x, (x.shape[-1],), g, b, eps=1e-5)


class JaxOps:
    def __init__(self):
        import jax
        import jax.numpy as jnp

        self.jax, self.np = jax, jnp

    def conv2d(self, x, w, padding):
        return self.jax.lax.conv_general_dilated(
            x, w, (1, 1), [(padding, padding)] * 2, dimension_numbers=("NCHW", "OIHW", "NCHW")
        )

    def max_pool2d(self, x, k):
        return self.jax.lax.reduce_window(
            x, -self.np.inf, self.jax.lax.max, (1, 1, k, k), (1, 1, k, k), "VALID"
        )

    def relu(self, x):
        return self.jax.nn.relu(x)

    def channel(self, b):
        return b.reshape(1, -1, 1, 1)

    def reshape(self, x, s):
        return x.reshape(s)

    def transpose(self, x, axes):
        return self.np.transpose(x, axes)

    def log_softmax(self, x):
        return self.jax.nn.log_softmax(x, axis=-1)

    def softmax(self, x):
        return self.jax.nn.softmax(x, axis=-1)

    def mean(self, x):
        return self.np.mean(x)

    def sum(self, x, axis):
        return self.np.sum(x, axis)

    def gelu(self, x):
        return self.jax.nn.gelu(x, approximate=True)

    def layer_norm(self, x, g, b):
        mu = self.np.mean(x, -1, keepdims=True)
        var = self.np.mean((x - mu) ** 2, -1, keepdims=True)
        return (x - mu) / self.np.sqrt(var + 1e-5) * g + b


class DlvmOps:
    def __init__(self):
        import dlvm_eq as dq

        self.dq = dq

    def conv2d(self, x, w, padding):
        return self.dq.conv2d(x, w, padding=padding)

    def max_pool2d(self, x, k):
        return self.dq.max_pool2d(x, k)

    def relu(self, x):
        return self.dq.relu(x)

    def channel(self, b):
        return self.dq.reshape(b, (1, -1, 1, 1))

    def reshape(self, x, s):
        return self.dq.reshape(x, s)

    def transpose(self, x, axes):
        return self.dq.transpose(x, axes)

    def log_softmax(self, x):
        return self.dq.log_softmax(x, axis=-1)

    def softmax(self, x):
        return self.dq.softmax(x, axis=-1)

    def mean(self, x):
        return self.dq.mean(x)

    def sum(self, x, axis):
        return self.dq.sum(x, axis=axis)

    def gelu(self, x):
        return self.dq.gelu(x, approximate=True)

    def layer_norm(self, x, g, b):
        return self.dq.layer_norm(x, axis=-1, eps=1e-5) * g + b


# ---------------------------------------------------------------- implementations


def reference_grads(model, params, x, y):
    """Loss and gradients in float64 PyTorch: the oracle every implementation is checked against."""
    import torch

    F = TorchOps()
    p = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    loss = model.loss(
        F, p, torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    )
    loss.backward()
    return loss.item(), {k: v.grad.numpy() for k, v in p.items()}


class Implementation:
    name = ""
    note = ""

    def check(self, want_loss, want_grads):
        loss, grads = self.value_and_grad()
        if not np.isclose(loss, want_loss, rtol=1e-3, atol=1e-4):
            raise AssertionError(f"{self.name}: loss {loss} != {want_loss} (float64)")
        for k, w in want_grads.items():
            g = np.asarray(grads[k], np.float64)
            scale = max(float(np.max(np.abs(w))), 1e-6)
            err = float(np.max(np.abs(g - w))) / scale
            if err > 2e-3:
                raise AssertionError(f"{self.name}: gradient {k} off by {err:.2e} of its scale")


class Torch(Implementation):
    def __init__(self, model, params, x, y, compiled: bool):
        import torch

        self.torch, F = torch, TorchOps()
        self.p = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in params.items()}
        self.x, self.y = torch.from_numpy(x.copy()), torch.from_numpy(y.copy())
        loss = lambda p, x, y: model.loss(F, p, x, y)
        self.loss = torch.compile(loss) if compiled else loss
        self.opt = torch.optim.SGD(list(self.p.values()), lr=LR)
        if PINNED:
            torch.set_num_threads(PINNED)
        self.name = "torch.compile" if compiled else "PyTorch eager"
        self.note = f"torch {torch.__version__}, {torch.get_num_threads()} threads"

    def value_and_grad(self):
        for v in self.p.values():
            v.grad = None
        loss = self.loss(self.p, self.x, self.y)
        loss.backward()
        return loss.item(), {k: v.grad.numpy() for k, v in self.p.items()}

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(self.p, self.x, self.y)
        loss.backward()
        self.opt.step()
        return loss


class Jax(Implementation):
    def __init__(self, model, params, x, y):
        import jax

        F = JaxOps()
        self.jax = jax
        loss = lambda p, x, y: model.loss(F, p, x, y)
        self.vg = jax.jit(jax.value_and_grad(loss))

        @jax.jit
        def train_step(p, x, y):
            value, grads = jax.value_and_grad(loss)(p, x, y)
            return value, jax.tree_util.tree_map(lambda a, g: a - LR * g, p, grads)

        self.train_step = train_step
        self.p = {k: jax.numpy.asarray(v) for k, v in params.items()}
        self.x, self.y = jax.numpy.asarray(x), jax.numpy.asarray(y)
        t0 = time.perf_counter()
        jax.block_until_ready(train_step(self.p, self.x, self.y))
        self.name = "JAX jit"
        self.note = f"jax {jax.__version__}, SGD inside the jit; {time.perf_counter() - t0:.2f} s to compile"

    def value_and_grad(self):
        value, grads = self.vg(self.p, self.x, self.y)
        return float(value), {k: np.asarray(v) for k, v in grads.items()}

    def step(self):
        value, self.p = self.train_step(self.p, self.x, self.y)
        return self.jax.block_until_ready(value)


def dlvm_step_functions(model):
    """(value_and_grad, train_step) as dlvm_eq functions of a params pytree."""
    import dlvm_eq as dq

    F = DlvmOps()
    loss = lambda p, x, y: model.loss(F, p, x, y)
    vg = dq.value_and_grad(loss, argnums=0)

    def train_step(p, x, y):
        value, grads = vg(p, x, y)
        return value, dq.tree_map(lambda a, g: a - LR * g, p, grads)

    return dq.jit(vg), dq.jit(train_step)


class DlvmEq(Implementation):
    def __init__(self, model, params, x, y):
        t0 = time.perf_counter()
        self.vg, self.train_step = dlvm_step_functions(model)
        self.p = {k: v.copy() for k, v in params.items()}
        self.x, self.y = x, y
        self.train_step(self.p, x, y)
        self.compile_s = time.perf_counter() - t0
        self.name = BASELINE
        self.note = "jit(train_step), SGD inside the jit, target cpu"

    def value_and_grad(self):
        value, grads = self.vg(self.p, self.x, self.y)
        return float(value), grads

    def step(self):
        value, self.p = self.train_step(self.p, self.x, self.y)
        return value


# ---------------------------------------------------------------- compile times

COMPILE_SNIPPET = """
import sys, time
sys.path.insert(0, {here!r})
import models
m = models.MODELS[{name!r}]
t0 = time.perf_counter()
vg, train_step = models.dlvm_step_functions(m)
train_step(m.params(), *m.data())
print(time.perf_counter() - t0)
"""


def compile_times(name: str) -> tuple[float, float]:
    """(cold, warm) seconds to the first finished step, each in a fresh process: first with an
    empty cache directory, then with the one the first run filled."""
    here = str(Path(__file__).resolve().parent)
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "DLVM_EQ_CACHE_DIR": cache}
        out = []
        for _ in range(2):
            run = subprocess.run(
                [sys.executable, "-c", COMPILE_SNIPPET.format(here=here, name=name)],
                env=env,
                capture_output=True,
                text=True,
                timeout=1800,
            )
            if run.returncode != 0:
                raise RuntimeError(run.stderr[-2000:])
            out.append(float(run.stdout.strip().splitlines()[-1]))
    return out[0], out[1]


# ---------------------------------------------------------------- running


def implementations(model, params, x, y):
    made, skipped = [], []
    makers = [
        ("dlvm_eq", lambda: DlvmEq(model, params, x, y)),
        ("PyTorch eager", lambda: Torch(model, params, x, y, compiled=False)),
        ("torch.compile", lambda: Torch(model, params, x, y, compiled=True)),
        ("JAX jit", lambda: Jax(model, params, x, y)),
    ]
    for name, make in makers:
        try:
            made.append(make())
        except ImportError as e:
            skipped.append((name, f"not installed ({e.name})"))
        except Exception as e:
            traceback.print_exc()
            skipped.append((name, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"))
    return made, skipped


def bench(model, rounds: int, steps: int, clock=time.perf_counter):
    params, (x, y) = model.params(), model.data()
    want_loss, want_grads = reference_grads(model, params, x, y)
    impls, skipped = implementations(model, params, x, y)
    for impl in impls:
        impl.check(want_loss, want_grads)
        for _ in range(2):
            impl.step()
    times = {impl.name: [] for impl in impls}
    for _ in range(rounds):
        for impl in impls:
            t0 = clock()
            for _ in range(steps):
                impl.step()
            times[impl.name].append((clock() - t0) / steps)
    rows = []
    for impl in impls:
        t = times[impl.name]
        q = statistics.quantiles(t, n=4) if len(t) > 1 else [t[0]] * 3
        rows.append(
            {
                "name": impl.name,
                "timing": Timing(statistics.median(t), q[0], q[2], len(t)),
                "note": impl.note,
            }
        )
    rows += [{"name": n, "timing": None, "note": why} for n, why in skipped]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=sorted(MODELS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--no-compile-times", action="store_true")
    ap.add_argument("--update", type=Path)
    ap.add_argument("--threads", type=int, help="pin to this many CPUs (read before imports)")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the process's CPU time per step (with --threads 1, what other jobs on a "
        "shared machine do not inflate)",
    )
    args = ap.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    parts = [
        f"{SECTION}\n\n`.venv/bin/python benchmarks/models.py --update BENCHMARKS.md` "
        f"({datetime.date.today().isoformat()}; {machine_line()}"
        + (f"; unset {', '.join(UNSET)}" if UNSET else "")
        + (f"; pinned to {PINNED} CPU(s)" if PINNED else "")
        + (f"; {args.clock} time per step" if args.clock != "wall" else "")
        + "). Gradients of every row "
        "checked against float64 PyTorch before timing; step = value, gradient and SGD update."
    ]
    for name in args.only or list(MODELS):
        model = MODELS[name]
        print(f"  {model.title} ...", flush=True)
        rows = bench(model, args.rounds, args.steps, clock)
        parts.append(f"### {model.title}\n\n" + timing_table(rows, BASELINE))
        if not args.no_compile_times:
            cold, warm = compile_times(name)
            parts.append(
                f"dlvm_eq compile to the first step: cold {cold:.2f} s, warm cache {warm:.2f} s."
            )
    text = "\n\n".join(parts) + "\n"
    print(text)
    if args.update:
        update_section(args.update, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
