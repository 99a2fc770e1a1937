"""Exact checks of adjoint programs: sympy.diff of the forward program against the adjoint.

    report = verify_adjoint(f, f_grad, wrt=(0,))          # raises VerificationError if wrong
    verify_gradient(lambda x: dq.sum(dq.exp(x) * x), [(3,)])

The adjoint follows DLVM's convention (and dlvm_eq.ad's): its parameters are the forward
parameters, then (if seedable) one seed per differentiated output; its results are the kept
outputs (`keeping`), then one gradient per `wrt` parameter. Without seeds the seed is ones.
Each gradient element k of parameter x must equal d/dx_k of sum_j seed_j * out_j, as a sympy
identity (ties of max/relu excepted, see identity.py); a mismatch comes with a point where
the two differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import sympy as sp

from ..errors import DlvmError
from ..ir.module import Function, Module
from ..ir.types import DType, TensorType, TupleType
from . import VerificationError
from .identity import PROVEN, PROVEN_AE, ZeroProver, derivative
from .symbolic import evaluate_function, number, symbol_array, to_number


@dataclass
class AdjointReport:
    forward: str
    adjoint: str
    wrt: tuple[int, ...]
    elements: int = 0  # gradient elements compared
    proven_ae: int = 0  # ... equal except on ties
    unproven: list[str] = field(default_factory=list)  # sympy undecided, numerically equal
    # (to 1e-6: an f32 constant folded by the optimizer is inexact)

    @property
    def ok(self) -> bool:
        """True: a wrong adjoint raises VerificationError instead of returning a report."""
        return True

    @property
    def exact(self) -> bool:
        """Every element was proven by sympy (none only numerically)."""
        return not self.unproven

    def __str__(self) -> str:
        text = (
            f"@{self.adjoint} is the adjoint of @{self.forward} wrt "
            f"{', '.join(map(str, self.wrt))}: {self.elements} gradient elements checked"
        )
        if self.proven_ae:
            text += f", {self.proven_ae} equal except where a comparison ties"
        if self.unproven:
            text += f", {len(self.unproven)} not decided by sympy (numerically equal)"
        return text


def _outputs(value, t) -> list:
    return list(value) if isinstance(t, TupleType) else [value]


def _params(fn: Function, fixed: dict | None = None) -> list[np.ndarray]:
    args = []
    for i, p in enumerate(fn.params):
        if not isinstance(p.type, TensorType):
            raise DlvmError(f"@{fn.name}: parameter %{p.name} has tuple type {p.type}")
        if (
            fixed and i in fixed
        ):  # a concrete value (indices of take: sympy cannot index by a symbol)
            value = np.asarray(fixed[i])
            arr = np.empty(value.shape, dtype=object)
            for idx in np.ndindex(value.shape):
                arr[idx] = number(value[idx], p.type.dtype)
            args.append(arr)
            continue
        args.append(symbol_array(p.name, p.type.shape, p.type.dtype))
    return args


def _numeric_difference(e, g, rng, points: int = 3, rtol: float = 1e-6):
    """(point, e value, g value) where e and g clearly differ, or None. Differences within
    rtol are float rounding (an f32 constant folded by the optimizer), not errors."""
    syms = sorted((e - g).free_symbols, key=lambda s: s.name)
    for _ in range(points):
        point = {
            s: sp.Float(rng.uniform(0.3, 2.0) * (1 if s.is_positive else rng.choice((-1, 1))))
            for s in syms
        }
        a, b = (sp.sympify(x).xreplace(point).evalf() for x in (e, g))
        if not (a.is_Number and b.is_Number):
            continue
        a, b = complex(a), complex(b)
        if abs(a - b) > rtol * max(1.0, abs(a), abs(b)):
            return point, a, b
    return None


def verify_adjoint(
    forward: Function,
    adjoint: Function,
    wrt=None,
    module: Module | None = None,
    seedable: bool = False,
    keeping=None,
    from_index: int | None = None,
    seed: int = 0,
    fixed: dict | None = None,
    sympy_seconds: float = 4.0,
) -> AdjointReport:
    """Check that `adjoint` computes the vector-Jacobian product of `forward` exactly.

    wrt: forward parameter indices (default: every float parameter). Raises VerificationError
    naming the parameter, element, expected and computed expressions and a counterexample.
    fixed: {parameter index: array} for parameters given concrete values (integer indices).
    sympy_seconds: sympy's time to decide one difference is zero; past it, an element that
    agrees numerically is listed as not decided (`report.exact` is then False)."""
    params = _params(forward, fixed)
    outs = _outputs(evaluate_function(forward, params, module), forward.result_type)
    rt = forward.result_type
    out_types = list(rt.elements) if isinstance(rt, TupleType) else [rt]
    if wrt is None:
        wrt = tuple(i for i, p in enumerate(forward.params) if p.type.dtype.is_float)
    wrt = (wrt,) if isinstance(wrt, int) else tuple(wrt)
    selected = (
        [from_index]
        if from_index is not None
        else [i for i, t in enumerate(out_types) if t.dtype.is_float]
    )
    keeping = tuple(keeping or ())
    seeds = []
    total = sp.S.Zero
    for j in selected:
        t = out_types[j]
        s = (
            symbol_array(f"seed{j}", t.shape, DType.f64)
            if seedable
            else np.full(t.shape, sp.S.One, object)
        )
        seeds.append(s)
        total += sp.Add(*[a * b for a, b in zip(np.asarray(s).flat, np.asarray(outs[j]).flat)])
    args = params + (seeds if seedable else [])
    if len(args) != len(adjoint.params):
        raise VerificationError(
            f"@{adjoint.name} takes {len(adjoint.params)} parameters; the "
            f"adjoint of @{forward.name} {'with' if seedable else 'without'} "
            f"seeds takes {len(args)}"
        )
    for a, p in zip(args, adjoint.params):
        if tuple(np.shape(a)) != tuple(p.type.shape):
            raise VerificationError(
                f"@{adjoint.name}: parameter %{p.name} is {p.type}, expected shape {np.shape(a)}"
            )
    got = _outputs(evaluate_function(adjoint, args, module), adjoint.result_type)
    if len(got) != len(keeping) + len(wrt):
        raise VerificationError(
            f"@{adjoint.name} returns {len(got)} values; expected "
            f"{len(keeping)} kept outputs and {len(wrt)} gradients"
        )
    prover = ZeroProver(timeout=sympy_seconds)
    rng = np.random.default_rng(seed)
    report = AdjointReport(forward.name, adjoint.name, wrt)
    for k, j in enumerate(keeping):
        _compare(
            prover,
            rng,
            report,
            np.asarray(outs[j]),
            np.asarray(got[k]),
            f"kept output {j}",
            adjoint,
        )
    for n, i in enumerate(wrt):
        x = params[i]
        expected = np.empty(x.shape, dtype=object)
        for idx in np.ndindex(x.shape):
            expected[idx] = derivative(total, x[idx])
        _compare(
            prover,
            rng,
            report,
            expected,
            np.asarray(got[len(keeping) + n]),
            f"the gradient for parameter {i} (%{forward.params[i].name})",
            adjoint,
        )
    return report


def _compare(prover, rng, report, expected, got, what, adjoint) -> None:
    if expected.shape != got.shape:
        raise VerificationError(
            f"@{adjoint.name}: {what} has shape {got.shape}, expected {expected.shape}"
        )
    for idx in np.ndindex(expected.shape):
        e = sp.sympify(to_number(expected[idx]))
        g = sp.sympify(to_number(got[idx]))
        status = prover.status(e - g)
        report.elements += 1
        if status == PROVEN:
            continue
        if status == PROVEN_AE:
            report.proven_ae += 1
            continue
        at = f"element [{', '.join(map(str, idx))}] of " if idx else ""
        bad = _numeric_difference(e, g, rng)
        if bad is not None:
            point, a, b = bad
            where = ", ".join(f"{s} = {float(v):.4g}" for s, v in point.items())
            raise VerificationError(
                f"@{adjoint.name}: {at}{what} is wrong\n  expected: {e}\n  computed: {g}\n"
                f"  at {where}: expected {_show(a)}, computed {_show(b)}"
            )
        report.unproven.append(f"{at}{what}: {e} vs {g}")


def _show(z: complex) -> str:
    return f"{z.real:.8g}" if z.imag == 0 else f"{z:.6g}"


def verify_gradient(fn, example_shapes, argnums=0, dtype: str = "f32") -> AdjointReport:
    """Trace a Python DSL function on `example_shapes` (shapes, or example arrays/specs),
    differentiate it with dlvm_eq.ad (the e-graph adjoint rules and optimizer), and check the
    adjoint program against sympy.diff of the traced forward program, exactly."""
    from ..ad import adjoint_function
    from ..dsl.tracing import spec, trace, type_of

    examples = [spec(s, dtype) if isinstance(s, (tuple, list, int)) else s for s in example_shapes]
    forward = trace(fn, [type_of(x) for x in examples])
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    adj = adjoint_function(None, forward, wrt=nums, tuple_result=True)
    return verify_adjoint(forward, adj, wrt=nums)
