"""Reductions: `reduce` with a combinator along some axes, and `cumsum` (running sums).

    %s = reduce %x: <4 x 5 x f32> by add init 0: f32 along 1      // <4 x f32>

A combinator is one row of COMBINATORS: its numpy ufunc, its sympy fold, its kernel name,
identity and kernel step (`scalar`: acc (op) v, written with codegen's ScalarVocabulary, as an
elementwise op's formula); the interpreter, verify/symbolic.py and the kernels
(codegen/kernels/spec.py, codegen/llvm/lower_expr.py's `combine`) read it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ...records import dataclass
from ..op_spec import REDUCE, SCAN, OpSpec, fail, quiet, tensors
from ..types import BOOL, DType
from .batch_rules import shift_axis


@dataclass(frozen=True)
class Combinator:
    """How a reduction folds its elements (add, multiply, max, min): one row of COMBINATORS."""

    ufunc: np.ufunc
    kernel: str  # the fused-kernel name (codegen/kernels/spec.py)
    identity: float  # the kernels' initial value
    sympy: str  # the sympy class folding the elements with init: Add, Mul, Max, Min
    bool_identity: bool  # numpy on bools: add and max are `or` (False), multiply and min `and`
    # one kernel step acc (op) v: floats' add and multiply reassociable (vectorizable), max and
    # min propagating NaN as numpy's
    scalar: Callable

    def init(self, dtype: DType):
        """The reduction's `init` attribute for elements of `dtype` (the DSL's reductions):
        the identity, in range for i32 (the extreme ints for max and min)."""
        if dtype is BOOL:
            return self.bool_identity
        if dtype.is_float or math.isfinite(self.identity):
            return self.identity if dtype.is_float else int(self.identity)
        info = np.iinfo(np.int32)
        return int(info.min if self.identity < 0 else info.max)


COMBINATORS = {
    "add": Combinator(np.add, "add", 0.0, "Add", False, lambda sv, a, v: sv.add(a, v, True)),
    "multiply": Combinator(
        np.multiply, "mul", 1.0, "Mul", True, lambda sv, a, v: sv.mul(a, v, True)
    ),
    "max": Combinator(np.maximum, "max", -math.inf, "Max", False, lambda sv, a, v: sv.max(a, v)),
    "min": Combinator(np.minimum, "min", math.inf, "Min", True, lambda sv, a, v: sv.min(a, v)),
}
REDUCE_COMBINATORS = {name: c.ufunc for name, c in COMBINATORS.items()}


def _reduce_type(types, attrs):
    (a,) = tensors("reduce", types)
    axes = tuple(attrs["axes"])
    if attrs["combinator"] not in COMBINATORS:
        fail(
            "reduce",
            f"unknown combinator {attrs['combinator']!r}; expected one of "
            + ", ".join(COMBINATORS),
        )
    if len(set(axes)) != len(axes) or any(not 0 <= ax < a.rank for ax in axes):
        fail("reduce", f"axes {list(axes)} are not distinct axes of {a}")
    return a.with_shape(tuple(d for i, d in enumerate(a.shape) if i not in axes))


def _reduce(args, attrs):
    (x,) = args
    fn = REDUCE_COMBINATORS[attrs["combinator"]]
    axes = tuple(attrs["axes"])
    init = np.asarray(attrs["init"], dtype=x.dtype)
    if not axes:
        return fn(x, init)
    return fn.reduce(x, axis=axes, initial=init[()]).astype(x.dtype, copy=False)


def _cumsum_type(types, attrs):
    (a,) = tensors("cumsum", types)
    if not 0 <= attrs["axis"] < a.rank:
        fail("cumsum", f"axis {attrs['axis']} out of range for {a}")
    if a.dtype is BOOL:
        fail("cumsum", "bool operand; cast it with dataTypeCast first")
    if attrs["reverse"] not in (0, 1):
        fail("cumsum", f"reverse must be 0 or 1, not {attrs['reverse']}")
    return a


def _cumsum(args, attrs):
    (x,) = args
    k = attrs["axis"]
    if attrs["reverse"]:
        return np.flip(np.cumsum(np.flip(x, k), axis=k, dtype=x.dtype), k).copy()
    return np.cumsum(x, axis=k, dtype=x.dtype)


def _fold(sv, comb: Combinator, dtype: DType):
    """(init, elements) -> their sympy fold: bools by And/Or (numpy's bool arithmetic), Max
    and Min by verify's extremum (no pairwise comparisons), Add and Mul as they are."""
    if dtype is BOOL:
        cls = sv.sp.And if comb.bool_identity else sv.sp.Or
        return lambda init, xs: cls(init, *xs)
    cls = getattr(sv.sp, comb.sympy)
    if comb.sympy in ("Max", "Min"):
        return lambda init, xs: sv.extremum(cls, [init, *xs])
    return lambda init, xs: cls(init, *xs)


def _reduce_symbolic(sv, args, attrs, rtype):
    (x,) = args
    fold = _fold(sv, COMBINATORS[attrs["combinator"]], rtype.dtype)
    init = sv.number(attrs["init"], rtype.dtype)
    axes = tuple(attrs["axes"])
    if not axes:
        return sv.as_array(np.frompyfunc(lambda v: fold(init, [v]), 1, 1)(x))
    kept = [i for i in range(x.ndim) if i not in axes]
    moved = np.transpose(x, kept + list(axes))
    flat = moved.reshape(tuple(x.shape[i] for i in kept) + (-1,))
    out = np.empty(rtype.shape, dtype=object)
    for idx in np.ndindex(out.shape):
        out[idx] = fold(init, list(flat[idx]))
    return out


def reduce_spec() -> OpSpec:
    return OpSpec(
        "reduce",
        REDUCE,
        1,
        "Reduce",
        _reduce_type,
        quiet(_reduce),
        attrs=("combinator", "init", "axes"),
        egg_attrs=(("combinator", "String"), ("init", "f64"), ("axes", "axis")),
        batch=shift_axis("axes"),
        symbolic=_reduce_symbolic,
    )


def cumsum_spec() -> OpSpec:
    # `cumsum %x: T along k [reverse]`: running sums along axis k, from the end with `reverse`
    # (attribute reverse: bool); its adjoint is the cumsum the other way
    return OpSpec(
        "cumsum",
        SCAN,
        1,
        "Cumsum",
        _cumsum_type,
        _cumsum,
        attrs=("axis", "reverse"),
        egg_attrs=(("axis", "i64"), ("reverse", "bool")),
        batch=shift_axis("axis"),
    )
