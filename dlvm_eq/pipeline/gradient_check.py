"""`check_grads` as `jax.test_util.check_grads`: forward mode (`dq.jvp`) and reverse mode
(`dq.grad` for a scalar function, `dq.vjp` otherwise) against float64 central differences
(dlvm_eq/verify/numeric.py), recursively up to `order`.

    check_grads(loss, (w, x), order=2)                  # raises GradientCheckError on a disagreement
    check_grads(f, (x,), order=2, modes=("fwd", "rev"))  # JAX's default modes: jvp checked too

The default modes are ("rev",), not JAX's ("fwd", "rev"): reverse mode is what a training step
runs, and a forward-mode check of order 2 differentiates the program four times.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..verify import numeric
from ..verify.numeric import GradientCheck, GradientCheckError
from .differentiate import grad as dq_grad
from .differentiate import vjp
from .forward import jvp


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _is_scalar(f, args) -> bool:
    out = _as_tuple(f(*args))
    return len(out) == 1 and np.ndim(out[0]) == 0


def check_jvp(f, args, *, argnums, eps=1e-6, rtol=1e-5, atol=1e-8, seed=0) -> GradientCheck:
    """dq.jvp of f at args along a random direction against central differences."""
    rng = np.random.default_rng(seed)
    v = {i: rng.standard_normal(np.shape(args[i])) for i in argnums}

    def along(t):
        moved = [a + t * v[i] if i in v else a for i, a in enumerate(args)]
        return [np.asarray(o, np.float64) for o in _as_tuple(f(*moved))]

    fd = [(a - b) / (2 * eps) for a, b in zip(along(eps), along(-eps))]

    def only_nums(*xs):
        full = list(args)
        for i, x in zip(argnums, xs):
            full[i] = x
        return f(*full)

    _, tangent = jvp(only_nums, tuple(args[i] for i in argnums), tuple(v[i] for i in argnums))
    got = [np.asarray(t, np.float64) for t in _as_tuple(tangent)]
    u = [rng.standard_normal(np.shape(o)) for o in fd]  # compared along a random cotangent
    numeric_value = float(sum(np.sum(a * b) for a, b in zip(u, fd)))
    analytic = float(sum(np.sum(a * b) for a, b in zip(u, got)))
    if not abs(numeric_value - analytic) <= atol + rtol * max(abs(numeric_value), abs(analytic)):
        raise GradientCheckError(
            f"the jvp disagrees with finite differences along a random direction (seed {seed}): "
            f"central differences give {numeric_value:.10g}, the jvp gives {analytic:.10g}"
        )
    return GradientCheck(numeric_value, analytic)


def check_grads(
    f,
    args,
    order: int = 1,
    modes=("rev",),
    atol: float | None = None,
    rtol: float | None = None,
    eps: float | None = None,
    *,
    grad=None,
    argnums=None,
    seed: int = 0,
) -> list[GradientCheck]:
    """Check f's derivatives up to `order` in `modes` ("fwd": dq.jvp, "rev": dq.grad of a
    scalar f, `grad` if given, else dq.vjp); raises GradientCheckError, returns the checks."""
    rtol = 1e-5 if rtol is None else rtol
    atol = 1e-8 if atol is None else atol
    args = tuple(
        np.asarray(a, np.float64) if np.asarray(a).dtype.kind == "f" else np.asarray(a)
        for a in args
    )
    nums = (
        tuple(i for i, a in enumerate(args) if a.dtype.kind == "f") if argnums is None else argnums
    )
    nums = (nums,) if isinstance(nums, int) else tuple(nums)
    options: dict[str, Any] = dict(argnums=nums, rtol=rtol, atol=atol, seed=seed)
    checks: list[GradientCheck] = []
    if "rev" in modes:
        if grad is not None or _is_scalar(f, args):
            checks += numeric.check_grads(f, args, order, grad=grad or dq_grad, eps=eps, **options)
        else:
            checks.append(
                numeric.check_vjp(
                    f, args, lambda ct: vjp(f, *args)[1](ct), mode="vjp", eps=eps or 1e-6, **options
                )
            )
    if "fwd" in modes:
        checks.append(check_jvp(f, args, eps=eps or 1e-6, **options))
        if order >= 2:  # the jvp along a fixed direction, itself checked in forward mode
            rng = np.random.default_rng(seed + 7)
            v = tuple(rng.standard_normal(np.shape(args[i])) for i in nums)

            def tangent(*a):
                return jvp(lambda *xs: f(*_put(a, nums, xs)), tuple(a[i] for i in nums), v)[1]

            for c in check_grads(
                tangent, args, order - 1, ("fwd",), atol * 10, rtol * 10, eps or 1e-5, argnums=nums
            ):
                c.order += 1
                checks.append(c)
    if not {"fwd", "rev"} >= set(modes):
        raise ValueError(f"check_grads: modes are 'fwd' and 'rev', not {modes!r}")
    return checks


def _put(args, nums, xs) -> list:
    full = list(args)
    for i, x in zip(nums, xs):
        full[i] = x
    return full


__all__ = ["check_grads", "check_jvp"]
