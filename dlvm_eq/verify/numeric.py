"""float64 finite-difference gradient checks for plain Python callables over numpy arrays.

    check_vjp(f, (x, w), grad_f)                 # scalar f: grad_f(x, w) -> (gx, gw)
    out, f_vjp = dq.vjp(g, x)
    check_vjp(g, (x,), f_vjp, mode="vjp")        # f_vjp(cotangent) -> one gradient per argument
    check_grads(f, (x, w), order=2, grad=dq.grad)  # the gradient, then Hessian-vector products

As in autograd's `check_vjp`: along a random direction v, the central difference
(f(x + eps v) - f(x - eps v)) / 2 eps, projected on a random cotangent u, must equal
<vjp(u), v>. Order 2 checks the gradient itself the same way: the gradient of
x -> <grad f(x), v> against central differences of grad f (a Hessian-vector product).
Arguments are converted to float64 so that the differences are accurate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DlvmError
from . import VerificationError


class GradientCheckError(VerificationError):
    """A gradient that disagrees with finite differences."""


@dataclass
class GradientCheck:
    numeric: float  # <u, J v> by central differences
    analytic: float  # <vjp(u), v>
    order: int = 1

    def __str__(self) -> str:
        return (
            f"order-{self.order} check: finite differences {self.numeric:.10g}, "
            f"gradient {self.analytic:.10g}"
        )


def _as_tuple(x) -> tuple:
    if isinstance(x, (tuple, list)):
        return tuple(x)
    return (x,)


def _float_args(args) -> tuple:
    out = []
    for a in args:
        a = np.asarray(a)
        out.append(a.astype(np.float64) if a.dtype.kind in "fc" else a)
    return tuple(out)


def _flat_outputs(y) -> list[np.ndarray]:
    return [np.asarray(o, dtype=np.float64) for o in _as_tuple(y)]


def _argnums(args, argnums) -> tuple[int, ...]:
    if argnums is None:
        return tuple(i for i, a in enumerate(args) if np.asarray(a).dtype.kind == "f")
    return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def check_vjp(
    f,
    args,
    vjp_or_grad,
    *,
    mode: str = "auto",
    argnums=None,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    seed: int = 0,
) -> GradientCheck:
    """Check a gradient or VJP of `f` at `args` along a random direction; raise
    GradientCheckError if it disagrees with central differences.

    mode "grad": `vjp_or_grad(*args)` is the gradient of a scalar f (one array per argnum,
    a tuple if several). mode "vjp": `vjp_or_grad(cotangent)` returns one gradient per
    argument of f (JAX's vjp_fn; a single array when f has one argument). "auto": "grad"
    when f returns a scalar, else "vjp". argnums: the arguments to check (default: every
    float argument)."""
    args = _float_args(args)
    nums = _argnums(args, argnums)
    if not nums:
        raise GradientCheckError("check_vjp: no float argument to differentiate")
    rng = np.random.default_rng(seed)
    raw = f(*args)
    outs = _flat_outputs(raw)
    if mode == "auto":
        mode = "grad" if len(outs) == 1 and outs[0].ndim == 0 else "vjp"
    if mode not in ("grad", "vjp"):
        raise ValueError(f"check_vjp: mode must be 'auto', 'grad' or 'vjp', not {mode!r}")
    v = {i: rng.standard_normal(np.shape(args[i])) for i in nums}

    def along(t):
        moved = [a + t * v[i] if i in v else a for i, a in enumerate(args)]
        return _flat_outputs(f(*moved))

    up, down = along(eps), along(-eps)
    jv = [(a - b) / (2 * eps) for a, b in zip(up, down)]
    if mode == "grad":
        if len(outs) != 1 or outs[0].ndim != 0:
            raise GradientCheckError("check_vjp: mode 'grad' needs a scalar function")
        numeric = float(jv[0])
        grads = _as_tuple(vjp_or_grad(*args))
        if len(grads) != len(nums):
            raise GradientCheckError(
                f"check_vjp: the gradient has {len(grads)} parts for {len(nums)} arguments"
            )
        picked = dict(zip(nums, grads))
    else:
        u = [rng.standard_normal(o.shape) for o in outs]
        numeric = float(sum(np.sum(a * b) for a, b in zip(u, jv)))
        ct = tuple(u) if isinstance(raw, (tuple, list)) else u[0]
        grads = _as_tuple(vjp_or_grad(ct))
        if len(grads) == len(args):
            picked = {i: grads[i] for i in nums}
        elif len(grads) == len(nums):
            picked = dict(zip(nums, grads))
        else:
            raise GradientCheckError(
                f"check_vjp: vjp returned {len(grads)} gradients for {len(args)} arguments"
            )
    analytic = 0.0
    for i in nums:
        g = picked[i]
        if g is None:
            raise GradientCheckError(f"check_vjp: no gradient for argument {i}")
        g = np.asarray(g, dtype=np.float64)
        if g.shape != np.shape(args[i]):
            raise GradientCheckError(
                f"check_vjp: the gradient for argument {i} has shape "
                f"{g.shape}, the argument {np.shape(args[i])}"
            )
        analytic += float(np.sum(g * v[i]))
    result = GradientCheck(numeric, analytic)
    scale = max(abs(numeric), abs(analytic))
    if not abs(numeric - analytic) <= atol + rtol * scale:
        raise GradientCheckError(
            f"the gradient disagrees with finite differences along a random direction "
            f"(seed {seed}): central differences give {numeric:.10g}, the "
            f"{'gradient' if mode == 'grad' else 'vjp'} gives {analytic:.10g} "
            f"(relative error {abs(numeric - analytic) / max(scale, 1e-300):.3g})"
        )
    return result


def _inner(g, v) -> object:
    """sum(g * v) for numpy arrays and for traced dq tensors alike."""
    prod = g * v
    return prod.sum() if hasattr(prod, "sum") else np.sum(prod)


def check_grads(
    f,
    args,
    order: int = 1,
    *,
    grad=None,
    argnums=None,
    eps: float | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    seed: int = 0,
) -> list[GradientCheck]:
    """Check `grad(f)` against finite differences, then (order 2) the gradient of
    x -> <grad f(x), v> against finite differences of grad f: a Hessian-vector check.

    grad: a transformation with JAX's signature `grad(fn, argnums=...)`, required here
    (`dlvm_eq.pipeline.check_grads` defaults it to dq.grad: the pipeline sits above verify);
    f must return a float scalar. Returns the checks done, first order first."""
    if order not in (1, 2, 3):
        raise ValueError("check_grads: order must be 1, 2 or 3")
    if grad is None:
        raise DlvmError(
            "check_grads: pass grad= (e.g. dq.grad), or call "
            "dlvm_eq.pipeline.check_grads, which defaults it to dq.grad"
        )
    args = _float_args(args)
    nums = _argnums(args, argnums)
    eps = eps if eps is not None else (1e-6 if order == 1 else 1e-5)
    gf = grad(f, argnums=nums)
    check = check_vjp(
        f, args, gf, mode="grad", argnums=nums, eps=eps, rtol=rtol, atol=atol, seed=seed
    )
    check.order = 1
    checks = [check]
    if order >= 2:
        rng = np.random.default_rng(seed + 1)
        v = [rng.standard_normal(np.shape(args[i])) for i in nums]

        def directional(*a):
            gs = _as_tuple(gf(*a))
            total = _inner(gs[0], v[0])
            for g, w in zip(gs[1:], v[1:]):
                total = total + _inner(g, w)
            return total

        for c in check_grads(
            directional,
            args,
            order - 1,
            grad=grad,
            argnums=nums,
            eps=eps,
            rtol=rtol * 10,
            atol=atol * 10,
            seed=seed + 2,
        ):
            c.order += 1
            checks.append(c)
    return checks
