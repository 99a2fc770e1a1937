"""IR ops on sympy: tensors are numpy object arrays of sympy expressions.

One implementation per op of the op table (`SYMBOLIC`, keyed like `OPS`; a test fails when an
op has none). Float tensors hold real sympy expressions, bool tensors sympy Booleans.

    x = symbol_array("x", (2,))               # [x[0], x[1]], real symbols
    evaluate_function(fn, [x])                # fn's result as an object array

Conventions (where sympy and IEEE floats differ):
- `dataTypeCast` is the identity between float types (f32 and f64 values are both reals);
  float -> bool is `x != 0`, bool -> number is 1/0, float -> i32 truncates toward zero.
- `round` is round-half-to-even on numbers (numpy's `rint`); on symbols it is an opaque
  function with derivative 0 (it only differs from floor(x + 1/2) at half-integers).
- `relu` is Max(x, 0), `max`/`min` are sympy's Max/Min, `select` is a Piecewise.
- Literals are exact: a float literal is the exact rational value of its double.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import sympy as sp

from ..errors import DlvmError
from ..ir.declared import require_body
from ..ir.module import Const, Function, Module
from ..ir.ops import LAYOUT, OPS
from ..ir.types import DType, TensorType, TupleType


class rint(sp.Function):
    """numpy's rint (round half to even); derivative 0."""

    is_integer = True

    @classmethod
    def eval(cls, x):
        if x.is_Number and x.is_finite:
            return sp.Integer(round(sp.Rational(x)))
        if x.is_integer:
            return x

    def fdiff(self, argindex=1):
        return sp.S.Zero


# Float constants that rule files write for an irrational number (the f64 nearest to it) are read
# as that number, so that sympy can prove the rule exact (erf' = 2/sqrt(pi) exp(-x^2)).
_IRRATIONALS = {2 / math.sqrt(math.pi): 2 / sp.sqrt(sp.pi)}


def number(value, dtype: DType):
    """A scalar of the given dtype as an exact sympy value."""
    if dtype is DType.bool:
        return sp.true if bool(value) else sp.false
    if dtype is DType.i32:
        return sp.Integer(int(value))
    v = float(value)
    if math.isnan(v):
        return sp.nan
    if math.isinf(v):
        return sp.oo if v > 0 else -sp.oo
    if v in _IRRATIONALS:
        return _IRRATIONALS[v]
    return sp.Integer(int(v)) if v.is_integer() else sp.Rational(v)


def scalar_array(x) -> np.ndarray:
    """A 0-d object array holding x (np.asarray would iterate sympy containers)."""
    a = np.empty((), dtype=object)
    a[()] = x
    return a


def as_array(x) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else scalar_array(x)


def symbol_array(name: str, shape, dtype: DType = DType.f32, **assumptions) -> np.ndarray:
    """A tensor of fresh symbols `name[i,j]`; real unless bool (then a Boolean symbol)."""
    out = np.empty(tuple(shape), dtype=object)
    for idx in np.ndindex(out.shape):
        label = name + ("[" + ",".join(map(str, idx)) + "]" if idx else "")
        if dtype is DType.bool:
            out[idx] = sp.Symbol(label)
        elif dtype is DType.i32:
            out[idx] = sp.Symbol(label, integer=True, **assumptions)
        else:
            out[idx] = sp.Symbol(label, real=True, **assumptions)
    return out


def to_number(b):
    """A Boolean as 1/0 (for comparing bool tensors by subtraction)."""
    if b is sp.true or b is True:
        return sp.S.One
    if b is sp.false or b is False:
        return sp.S.Zero
    if is_boolean(b):
        return sp.Piecewise((1, b), (0, True))
    return b


# ---------------------------------------------------------------- the table


def _elementwise(f: Callable, nin: int):
    ufunc = np.frompyfunc(f, nin, 1)

    def run(args, attrs, rtype):
        return as_array(ufunc(*args))

    return run


def _trunc(x):
    return sp.sign(x) * sp.floor(sp.Abs(x))


def _divide(args, attrs, rtype):
    if rtype.dtype is DType.i32:  # C-style truncation; x / 0 is 0 (as the op table says)
        f = lambda a, b: sp.Piecewise((0, sp.Eq(b, 0)), (_trunc(a / b), True))
    else:
        f = lambda a, b: a / b
    return as_array(np.frompyfunc(f, 2, 1)(*args))


# Elementwise ops mean what the registry's `sympy` says (ir/registry/); these few need this
# module's helpers: numpy's rint, and Max/Min without sympy's pairwise comparisons.
_OWN = {
    "round": lambda x: rint(x),
    "relu": lambda x: _extremum(sp.Max, [x, sp.S.Zero]),
    "min": lambda a, b: _extremum(sp.Min, [a, b]),
    "max": lambda a, b: _extremum(sp.Max, [a, b]),
}


def _registry_elementwise() -> dict[str, Callable]:
    """IR op -> its scalar sympy function, for every registry op with an elementwise meaning."""
    table = {}
    for name, spec in OPS.items():
        if name in _OWN:
            table[name] = _OWN[name]
        elif spec.sympy is not None:
            table[name] = (lambda f: lambda *xs: f(sp, *xs))(spec.sympy)
    return table


def _extremum(cls, args):
    """cls(*args) (Max or Min) without sympy's pairwise comparison of the arguments, which is
    slow (a reduction compares every pair, with assumption queries on each): the arguments are
    flattened, deduplicated and sorted, numbers are combined, and the result is left
    unevaluated. Distinct symbols are incomparable anyway; provers simplify the rest."""
    flat = []
    for a in map(sp.sympify, args):
        flat.extend(a.args if isinstance(a, cls) else (a,))
    flat = [a for a in flat if a != cls.identity]  # -oo for Max, oo for Min
    if any(a == cls.zero for a in flat):  # oo for Max, -oo for Min
        return cls.zero
    nums = [a for a in flat if a.is_Number]
    rest = sorted(set(a for a in flat if not a.is_Number), key=sp.default_sort_key)
    signed = any(
        isinstance(a, sp.Symbol) and (a.is_nonnegative is not None or a.is_nonpositive is not None)
        for a in rest
    )
    if not rest or (nums and signed):  # numbers only, or signs sympy can use: evaluate
        return cls(*args)
    if nums:
        rest.append(max(nums) if cls is sp.Max else min(nums))
    return rest[0] if len(rest) == 1 else cls(*rest, evaluate=False)


def _select(args, attrs, rtype):
    return as_array(np.frompyfunc(lambda a, b, m: sp.Piecewise((a, m), (b, True)), 3, 1)(*args))


def _concrete_indices(op: str, ids) -> np.ndarray:
    try:
        return np.array([int(v) for v in np.asarray(ids).flat], dtype=np.intp)
    except TypeError:
        raise DlvmError(f"{op}: symbolic evaluation needs concrete indices, got {ids}") from None


def is_boolean(v) -> bool:
    """Whether v is a sympy truth value (bool symbols are made without the real assumption)."""
    if isinstance(v, sp.Symbol):
        return v.is_real is None
    return isinstance(
        v,
        (
            sp.logic.boolalg.BooleanAtom,
            sp.logic.boolalg.BooleanFunction,
            sp.core.relational.Relational,
            bool,
        ),
    )


def _cast_element(v, target: DType):
    if target is DType.bool:
        return v if is_boolean(v) else sp.Ne(v, 0)
    if is_boolean(v):
        return to_number(v)
    if target is DType.i32:
        return _trunc(v)
    return v  # float <-> float: the same real number


def _cast(args, attrs, rtype):
    return as_array(np.frompyfunc(lambda v: _cast_element(v, attrs["dtype"]), 1, 1)(args[0]))


def _literal(args, attrs, rtype):
    t: TensorType = attrs["type"]
    value = np.asarray(attrs["value"])
    out = np.empty(t.shape, dtype=object)
    src = np.broadcast_to(value, t.shape)
    for idx in np.ndindex(t.shape):
        out[idx] = number(src[idx], t.dtype)
    return out


def _apply(args, attrs, rtype):
    raise DlvmError("apply is evaluated by evaluate_function (it needs the module)")


class SymbolicVocabulary:
    """What a registry op's meaning on sympy arrays (`OpSpec.symbolic`, ir/registry/) is
    written with: sympy itself, and this module's helpers.

        REGISTRY["dot"].symbolic(VOCABULARY, [a, b], {}, rtype)     # object arrays in and out
    """

    sp = sp

    @staticmethod
    def extremum(cls, args):
        return _extremum(cls, args)

    @staticmethod
    def number(value, dtype: DType):
        return number(value, dtype)

    @staticmethod
    def as_array(x) -> np.ndarray:
        return as_array(x)

    @staticmethod
    def indices(op: str, ids) -> np.ndarray:
        return _concrete_indices(op, ids)


VOCABULARY = SymbolicVocabulary()


def _build() -> dict[str, Callable]:
    table: dict[str, Callable] = {}
    for name, f in _registry_elementwise().items():
        table[name] = _elementwise(f, OPS[name].arity)
    # views, concatenate and slice move entries: the interpreter's numpy code (ir/registry/
    # layout.py) does the same on object arrays of sympy expressions
    for name, spec in OPS.items():
        if spec.kind == LAYOUT or name == "slice":
            table[name] = (lambda ev: lambda args, attrs, rtype: as_array(ev(args, attrs)))(
                spec.evaluate
            )
    # products, reductions, gathers: the registry's meaning on sympy arrays (OpSpec.symbolic)
    for name, spec in OPS.items():
        if spec.symbolic is not None:
            table[name] = (lambda f: lambda args, attrs, rtype: f(VOCABULARY, args, attrs, rtype))(
                spec.symbolic
            )
    table["divide"] = _divide
    table["select"] = _select
    table["cumsum"] = lambda args, attrs, rtype: OPS["cumsum"].evaluate(
        args, attrs
    )  # sums of objects
    table["dataTypeCast"] = _cast
    table["literal"] = _literal
    table["tuple"] = lambda args, attrs, rtype: tuple(args)
    table["extract"] = lambda args, attrs, rtype: args[0][attrs["index"]]
    table["apply"] = _apply
    return table


SYMBOLIC: dict[str, Callable] = _build()


def apply_op(op: str, args: list, attrs: dict, rtype) -> np.ndarray | tuple:
    """The symbolic result of one op: `args` are object arrays (tuples for `extract`)."""
    try:
        fn = SYMBOLIC[op]
    except KeyError:
        raise DlvmError(f"op {op!r} has no symbolic semantics in dlvm_eq.verify") from None
    return fn(args, attrs, rtype)


# ---------------------------------------------------------------- functions


def evaluate_function(fn: Function, args: list, module: Module | None = None):
    """fn's result on symbolic arguments (object arrays); a tuple for tuple results."""
    require_body(fn)  # declared adjoints: resolved by the pipeline first
    if len(args) != len(fn.params):
        raise DlvmError(f"@{fn.name} takes {len(fn.params)} arguments, got {len(args)}")
    env: dict[int, object] = {}
    for i, (p, a) in enumerate(zip(fn.params, args)):
        a = as_array(a)
        if not isinstance(p.type, TensorType) or a.shape != p.type.shape:
            raise DlvmError(f"@{fn.name}: argument {i} has shape {a.shape}, expected {p.type}")
        env[id(p)] = a

    def get(o):
        if isinstance(o, Const):
            return scalar_array(number(o.value, o.type.dtype))
        return env[id(o)]

    for inst in fn.body:
        vals = [get(o) for o in inst.operands]
        if inst.op == "apply":
            if module is None:
                raise DlvmError(f"@{fn.name}: apply needs the module")
            out = evaluate_function(module[inst.attrs["callee"]], vals, module)
        else:
            out = apply_op(inst.op, vals, inst.attrs, inst.result.type)
        env[id(inst.result)] = out
    result = get(fn.ret)
    if isinstance(fn.result_type, TupleType):
        return tuple(result)
    return result
