"""The implementations that benchmarks/mlp_step.py times side by side (dlvm_eq, a hand-written
numpy step, the matmuls alone, PyTorch, JAX), the data, and the float64 reference every one is
checked against before it is timed. Import it after common.reexec_without (mlp_step.py does),
so that numpy loads OpenBLAS without the overrides.
"""

from __future__ import annotations

import time

import numpy as np

BATCH, SIZES, LR = 256, (784, 256, 10), 0.01
BASELINE = "dlvm_eq"
MATMULS = "numpy: the 5 matmuls alone"
OUR_MATMULS = "dlvm_eq GEMM: the 5 matmuls alone"
ARGNUMS = (0, 1, 2, 3)


def data(seed: int = 0):
    """MNIST-shaped inputs in [0, 1), one-hot labels, He-initialised parameters."""
    from dlvm_eq.models import mlp

    rng = np.random.default_rng(seed)
    x = rng.random((BATCH, SIZES[0]), dtype=np.float32)
    onehot = np.eye(SIZES[-1], dtype=np.float32)[rng.integers(0, SIZES[-1], BATCH)]
    return mlp.init_params(list(SIZES), seed=seed), x, onehot


class Implementation:
    """`value_and_grad()` -> (loss, [dw1, db1, dw2, db2]) as numpy, for the check;
    `step()` runs one training step on the implementation's own parameters;
    `params()` -> its current parameters as numpy; `sync(out)` waits for async results."""

    name = ""
    note = ""
    reference_only = False  # timed for context, not a training step: not checked

    def sync(self, out):
        return out


class Device:
    """Where a run keeps its arrays: numpy for the cpu (and interp) target, CuPy for gpu."""

    def __init__(self, target: str):
        self.gpu = target == "gpu"
        if self.gpu:
            import cupy

            self.cp = cupy

    def put(self, a):
        return self.cp.asarray(a) if self.gpu else a.copy()

    def get(self, a) -> np.ndarray:
        return self.cp.asnumpy(a) if self.gpu else np.array(a)

    def sync(self, out):
        if self.gpu:
            self.cp.cuda.runtime.deviceSynchronize()
        return out


class OnDevice(Implementation):
    """An implementation whose parameters `self.p` and data live on `self.dev`."""

    def place(self, target: str, params, x, y) -> None:
        self.dev = Device(target)
        self.p = [self.dev.put(p) for p in params]
        self.x, self.y = self.dev.put(x), self.dev.put(y)

    def sync(self, out):
        return self.dev.sync(out)

    def params(self):
        return [self.dev.get(p) for p in self.p]


# ---------------------------------------------------------------- dlvm_eq


def dlvm_value_and_grad(target: str, args):
    """`dq.jit(dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3)), target=...)`, compiled on
    `args` (its first call traces, differentiates, optimizes and generates kernels)."""
    import dlvm_eq as dq
    from dlvm_eq.models import mlp

    step = dq.jit(dq.value_and_grad(mlp.loss, argnums=ARGNUMS), target=target)
    step(*args)
    return step


def pick_target(wanted: str, args) -> tuple[str, object, str]:
    """(target that ran, compiled value_and_grad, note); falls back to interp only where the
    wanted target raises."""
    import dlvm_eq as dq

    try:
        return wanted, dlvm_value_and_grad(wanted, args), ""
    except dq.DlvmError as e:
        if wanted == "interp":
            raise
        reason = str(e).strip().splitlines()[0]
        return (
            "interp",
            dlvm_value_and_grad("interp", args),
            f"target {wanted!r} failed ({reason}); ran on 'interp'",
        )


class DlvmEq(OnDevice):
    def __init__(self, params, x, y, target: str):
        from dlvm_eq.models import mlp

        self.sgd = mlp.sgd
        t0 = time.perf_counter()
        self.target, self.fn, self.detail = pick_target(target, (*params, x, y))
        self.compile_s = time.perf_counter() - t0
        self.place(self.target, params, x, y)
        self.name = BASELINE if self.target == "cpu" else f"{BASELINE} ({self.target})"
        self.note = f"jit(value_and_grad) + mlp.sgd, target {self.target}"
        report = self.fn.report(*self.p, self.x, self.y) if hasattr(self.fn, "report") else None
        self.report = str(report) if report is not None else ""

    def value_and_grad(self):
        value, grads = self.fn(*self.p, self.x, self.y)
        return float(value), [self.dev.get(g) for g in grads]

    def step(self):
        value, grads = self.fn(*self.p, self.x, self.y)
        self.sgd(self.p, grads, LR)
        return value


class DlvmEqUpdateInside(OnDevice):
    """The JAX way of writing it: the SGD update inside the jitted function."""

    def __init__(self, params, x, y, target: str):
        import dlvm_eq as dq
        from dlvm_eq.models import mlp

        vg = dq.value_and_grad(mlp.loss, argnums=ARGNUMS)

        def train_step(w1, b1, w2, b2, x, onehot):
            value, grads = vg(w1, b1, w2, b2, x, onehot)
            return value, [p - LR * g for p, g in zip((w1, b1, w2, b2), grads)]

        self.place(target, params, x, y)
        self.fn = dq.jit(train_step, target=target)
        self.fn(*self.p, self.x, self.y)
        self.name = f"{BASELINE}, SGD inside the jit" + ("" if target == "cpu" else f" ({target})")
        self.note = f"jit(train_step) returning (loss, new params), target {target}"

    value_and_grad = None  # checked through its loss and one step only

    def step(self):
        value, self.p = self.fn(*self.p, self.x, self.y)
        return value


class NumpyHandWritten(OnDevice):
    """The hand-written step; on the gpu target the same code on CuPy arrays (numpy's
    functions dispatch to CuPy), the step a CuPy user would write."""

    def __init__(self, params, x, y, target: str = "cpu"):
        from dlvm_eq.models import mlp

        self.place(target, params, x, y)
        self.mlp = mlp
        self.name = "CuPy hand-written" if self.dev.gpu else "numpy hand-written"
        self.note = "mlp.numpy_value_and_grad + mlp.sgd" + (
            " on CuPy arrays" if self.dev.gpu else ""
        )

    def value_and_grad(self):
        value, grads = self.mlp.numpy_value_and_grad(*self.p, self.x, self.y)
        return float(value), [self.dev.get(g) for g in grads]

    def step(self):
        value, grads = self.mlp.numpy_value_and_grad(*self.p, self.x, self.y)
        self.mlp.sgd(self.p, grads, LR)
        return value


class MatmulsOnly(Implementation):
    """Not a training step: the step's five matmuls alone, through numpy's OpenBLAS: the floor
    for a step that calls that BLAS (the numpy step does; dlvm_eq's CPU target has its own
    GEMM, timed alone by OurMatmulsOnly)."""

    name = MATMULS
    note = "x@w1, h@w2, dz2@w2.T, x.T@dh, h.T@dz2 (reference, not checked)"
    reference_only = True

    def __init__(self, params, x, y, target: str = "cpu"):
        rng = np.random.default_rng(1)
        n, (_, h, c) = BATCH, SIZES
        self.dev = dev = Device(target)
        if dev.gpu:
            self.name, self.note = (
                "CuPy: the 5 matmuls alone",
                self.note.replace("reference", "cuBLAS; reference"),
            )
        self.x, self.w1, self.w2 = dev.put(x), dev.put(params[0]), dev.put(params[2])
        self.h = dev.put(rng.random((n, h), dtype=np.float32))
        self.dz2 = dev.put(rng.random((n, c), dtype=np.float32))
        self.dh = dev.put(rng.random((n, h), dtype=np.float32))

    def sync(self, out):
        return self.dev.sync(out)

    def step(self):
        return (
            self.x @ self.w1,
            self.h @ self.w2,
            self.dz2 @ self.w2.T,
            self.x.T @ self.dh,
            self.h.T @ self.dz2,
        )


class OurMatmulsOnly(MatmulsOnly):
    """The same five products through dlvm_eq's GEMM (codegen/gemm_runtime), as its compiled
    step runs them (CPU only)."""

    name = OUR_MATMULS

    def __init__(self, params, x, y, target: str = "cpu"):
        super().__init__(params, x, y, target)
        from dlvm_eq.codegen.runtime import gemm_runtime

        pairs = [
            (self.x, self.w1),
            (self.h, self.w2),
            (self.dz2, self.w2.T),
            (self.x.T, self.dh),
            (self.h.T, self.dz2),
        ]
        outs = [np.empty((a.shape[0], b.shape[1]), np.float32) for a, b in pairs]
        self.products = [(a, b, o) for (a, b), o in zip(pairs, outs)]
        self.g = gemm_runtime
        if not gemm_runtime.enabled():
            self.note += "; forced: compiled code uses numpy's BLAS unless DLVM_EQ_GEMM=1"
        if not all(self._ours(a, b, o) for a, b, o in self.products):
            self.note += "; some through numpy (layouts it declines)"

    def _ours(self, a, b, o) -> bool:
        """Through our GEMM even where compiled code would not pick it (enabled() is false
        unless DLVM_EQ_GEMM=1); the switch is restored at once, so other rows are unaffected."""
        saved, self.g._ENABLED = self.g._ENABLED, True
        try:
            return self.g.matmul(a, b, o)
        finally:
            self.g._ENABLED = saved

    def step(self):
        for a, b, o in self.products:
            if not self._ours(a, b, o):
                np.matmul(a, b, out=o)
        return self.products[0][2]


# ---------------------------------------------------------------- PyTorch


def torch_loss(w1, b1, w2, b2, x, y):
    import torch

    h = torch.relu(x @ w1 + b1)
    return torch.nn.functional.cross_entropy(h @ w2 + b2, y)  # y: class probabilities (one-hot)


class Torch(Implementation):
    def __init__(self, params, x, y, compiled: bool):
        import torch

        self.torch = torch
        self.p = [torch.tensor(p.copy(), requires_grad=True) for p in params]
        self.x, self.y = torch.from_numpy(x.copy()), torch.from_numpy(y.copy())
        self.opt = torch.optim.SGD(self.p, lr=LR)
        self.loss = torch.compile(torch_loss) if compiled else torch_loss
        self.name = "torch.compile" if compiled else "PyTorch eager"
        self.note = f"torch {torch.__version__}, {torch.get_num_threads()} threads; " + (
            "torch.compile(loss), backward by AOTAutograd, optim.SGD eager"
            if compiled
            else "loss.backward() + optim.SGD"
        )
        if compiled:
            t0 = time.perf_counter()
            self.value_and_grad()
            self.compile_s = time.perf_counter() - t0
            self.note += f"; {self.compile_s:.1f} s to compile"

    def value_and_grad(self):
        for p in self.p:
            p.grad = None
        value = self.loss(*self.p, self.x, self.y)
        value.backward()
        return float(value.detach()), [p.grad.numpy().copy() for p in self.p]

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        value = self.loss(*self.p, self.x, self.y)
        value.backward()
        self.opt.step()
        return value

    def params(self):
        return [p.detach().numpy() for p in self.p]


# ---------------------------------------------------------------- JAX


class Jax(Implementation):
    name = "JAX jit(value_and_grad)"

    def __init__(self, params, x, y):
        import jax
        import jax.numpy as jnp

        def loss(params, x, y):
            w1, b1, w2, b2 = params
            h = jax.nn.relu(x @ w1 + b1)
            return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(h @ w2 + b2), axis=1))

        @jax.jit
        def train_step(params, x, y):  # the SGD update inside the jit, as JAX users write it
            value, grads = jax.value_and_grad(loss)(params, x, y)
            return value, [p - LR * g for p, g in zip(params, grads)]

        self.jax = jax
        self.vg = jax.jit(jax.value_and_grad(loss))
        self.train_step = train_step
        self.p = [jnp.asarray(p) for p in params]
        self.x, self.y = jnp.asarray(x), jnp.asarray(y)
        t0 = time.perf_counter()
        jax.block_until_ready(train_step(self.p, self.x, self.y))
        self.compile_s = time.perf_counter() - t0
        self.note = f"jax {jax.__version__}, SGD inside the jit; {self.compile_s:.2f} s to compile"

    def value_and_grad(self):
        value, grads = self.vg(self.p, self.x, self.y)
        return float(value), [np.asarray(g) for g in grads]

    def step(self):
        value, self.p = self.train_step(self.p, self.x, self.y)
        return value, self.p

    def sync(self, out):
        return self.jax.block_until_ready(out)

    def params(self):
        return [np.asarray(p) for p in self.p]


# ---------------------------------------------------------------- the check


def reference(params, x, y):
    """float64: loss, gradients, and the parameters after one SGD step."""
    from dlvm_eq.models import mlp

    p64 = [p.astype(np.float64) for p in params]
    value, grads = mlp.numpy_value_and_grad(*p64, x.astype(np.float64), y.astype(np.float64))
    return float(value), [np.asarray(g) for g in grads], [p - LR * g for p, g in zip(p64, grads)]


def check(impl: Implementation, ref) -> str | None:
    """None when loss, gradients and one SGD step agree with the float64 reference (float32
    tolerances); else what disagrees. Leaves the implementation one step further."""
    ref_value, ref_grads, ref_next = ref
    names = ("w1", "b1", "w2", "b2")
    if impl.value_and_grad is None:
        value, grads = float(np.asarray(impl.step())), []
    else:
        value, grads = impl.value_and_grad()
        impl.sync(impl.step())
    if not np.isclose(value, ref_value, rtol=1e-5, atol=1e-6):
        return f"loss {value!r} != {ref_value!r}"
    for name, g, r in zip(names, grads, ref_grads):
        scale = float(np.max(np.abs(r))) or 1.0
        if g.shape != r.shape or not np.allclose(g, r, rtol=1e-3, atol=1e-4 * scale):
            err = float(np.max(np.abs(g - r))) if g.shape == r.shape else float("nan")
            return f"d loss/d {name}: max abs error {err:.3g} (scale {scale:.3g}), shape {g.shape}"
    for name, p, r in zip(names, impl.params(), ref_next):
        if not np.allclose(p, r, rtol=1e-5, atol=1e-6):
            return f"{name} after one SGD step: max abs error {float(np.max(np.abs(p - r))):.3g}"
    return None
