"""Typing and evaluating e-graph terms (patterns of rules/*.egg) under an assignment.

Terms are typed by the op table's result-type rules, with the e-graph's own restriction that
elementwise operands have equal shapes (broadcasts are explicit there). Values come from a
backend: `SympyBackend` (object arrays of sympy expressions) or `NumpyBackend` (float64).

    ev = Evaluator(sigs)
    ev.type(term, asg)                      # TensorType, or raises Untypable
    ev.value(term, asg, SympyBackend(vals))  # object array
Terms of the scalar sort (rules/fusion.egg) are typed and valued as the tensors they denote:
`(SAdd a b)` as `(Add a b)`, `(Load t)` and `(Map s)` as their argument (pattern.py, helpers.py).
`(Adjoint i (Op ...) g)` is the vector-Jacobian product of Op at its i-th tensor operand
with cotangent g: element k is sum_j g_j * d Op(...)_j / d a_i[k].
"""

from __future__ import annotations

import math

import numpy as np
import sympy as sp

from ..egraph.serialized import EGG_TO_OP
from ..errors import DlvmError
from ..ir import window_ops
from ..ir.op_spec import egg_attrs_from
from ..ir.ops import ELEMENTWISE_KINDS, OPS, SELECT
from ..ir.registry.egraph_only import EGRAPH_ONLY, IR_FORM
from ..ir.types import DType, TensorType
from .helpers import HelperTypeError
from .identity import derivative
from .pattern import PCall, PLit, PVar, Vocab, pshow
from .symbolic import apply_op, as_array, number, scalar_array, symbol_array
from .window_search import HEADS as WINDOW_HEADS


class Untypable(Exception):
    """The term does not type-check (or a primitive is undefined) under this assignment."""


# constructor -> the op spec whose egg_attrs lay out its primitive arguments (the registry)
_BY_EGG = {spec.egg: spec for spec in OPS.values()}


def ctor_attrs(head: str, prims: list) -> dict:
    """IR attributes of an e-graph constructor from its primitive children, as the registry
    lays them out (OpSpec.egg_attrs; StridedSlice's in ir/registry/egraph_only.py)."""
    try:
        only = EGRAPH_ONLY.get(head)
        if only is not None and only.role == IR_FORM and only.attrs is not None:
            return only.attrs(tuple(prims))
        if head in WINDOW_HEADS:  # one packed attribute vector (ir/window_ops.pack)
            return window_ops.unpack(WINDOW_HEADS[head], tuple(int(v) for v in prims[0]))
        spec = _BY_EGG.get(head)
        if spec is not None and spec.egg_attrs:
            return egg_attrs_from(spec, prims)
    except (ValueError, TypeError, IndexError) as e:
        raise Untypable(f"bad attribute for {head}: {e}") from None
    return {}


def check_constant(v, dtype: DType) -> None:
    """The loader writes bools as 0.0/1.0 and ints as integral floats: nothing else occurs."""
    v = float(v)
    if dtype is DType.bool and v not in (0.0, 1.0):
        raise Untypable(f"a bool constant is 0.0 or 1.0, not {v}")
    if dtype is DType.i32 and not (v == v and math.isfinite(v) and v.is_integer()):
        raise Untypable(f"an i32 constant is an integer, not {v}")


# ---------------------------------------------------------------- primitives


def _div(a, b):
    if b == 0:
        raise Untypable("division by zero")
    if isinstance(a, int) and isinstance(b, int):
        return int(a / b)  # egglog's i64 division truncates
    return a / b


def _vec_set(v, i, x):
    if not 0 <= i < len(v):
        raise Untypable("vec-set out of range")
    return v[:i] + (x,) + v[i + 1 :]


def _vec_get(v, i):
    if not 0 <= i < len(v):
        raise Untypable("vec-get out of range")
    return v[i]


def _vec_remove(v, i):
    if not 0 <= i < len(v):
        raise Untypable("vec-remove out of range")
    return v[:i] + v[i + 1 :]


PRIM_FNS = {
    "vec-of": lambda *xs: tuple(int(x) for x in xs),
    "vec-empty": lambda: (),
    "vec-get": _vec_get,
    "vec-length": len,
    "vec-push": lambda v, x: v + (x,),
    "vec-pop": lambda v: v[:-1],
    "vec-append": lambda a, b: a + b,
    "vec-remove": _vec_remove,
    "vec-set": _vec_set,
    "vec-contains": lambda v, x: x in v,
    "vec-not-contains": lambda v, x: x not in v,
    "vec-range": lambda n: tuple(range(n)),
    "unstable-fn": lambda name, *bound: lambda *xs: PRIM_FNS[name](*bound, *xs),
    "unstable-vec-map": lambda f, v: tuple(f(x) for x in v),
    "+": lambda a, b: a + b,
    "-": lambda a, b=None: -a if b is None else a - b,
    "*": lambda a, b: a * b,
    "/": _div,
    "%": lambda a, b: int(math.fmod(a, b)) if b else _div(a, b),
    "min": min,
    "max": max,
    "neg": lambda a: -a,
    "abs": abs,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "!=": lambda a, b: a != b,
    "=": lambda a, b: a == b,
    "to-f64": float,
    "to-i64": int,
    "<<": lambda a, b: a << b,
    ">>": lambda a, b: a >> b,
    "&": lambda a, b: a & b,
    "|": lambda a, b: a | b,
    "^": lambda a, b: a ^ b,
    "and": lambda a, b: a and b,
    "or": lambda a, b: a or b,
    "not": lambda a: not a,
    "?defined": lambda a: True,
}


# ---------------------------------------------------------------- backends


class SympyBackend:
    """Exact values: tensors of sympy expressions."""

    def __init__(self, leaves: dict[str, np.ndarray]):
        self.leaves = leaves
        self.fresh = 0

    def leaf(self, name):
        return self.leaves[name]

    def const(self, value, dtype: DType):
        return scalar_array(number(value, dtype))

    def op(self, op, args, attrs, rtype):
        return apply_op(op, args, attrs, rtype)

    def vjp(self, op, args, attrs, rtype, i, g):
        """Element k: sum_j g_j * d out_j / d a_i[k], with a_i replaced by fresh symbols."""
        a = args[i]
        flat = list(a.flat)
        others = set().union(
            *[x.free_symbols for j, arr in enumerate(args) if j != i for x in arr.flat]
        )
        if (
            all(isinstance(x, sp.Symbol) for x in flat)
            and len(set(flat)) == len(flat)
            and not others & set(flat)
        ):
            z, back = a, None  # already independent symbols: differentiate in place
        else:
            self.fresh += 1
            z = symbol_array(f"?z{self.fresh}", a.shape)
            back = {zk: ak for zk, ak in zip(z.flat, flat)}
        out = apply_op(op, args[:i] + [z] + args[i + 1 :], attrs, rtype)
        res = np.empty(a.shape, dtype=object)
        for k in np.ndindex(a.shape):
            zk = z[k]
            total = sp.Add(
                *[gj * derivative(oj, zk) for gj, oj in zip(g.flat, out.flat) if oj.has(zk)]
            )
            res[k] = total if back is None else total.xreplace(back)
        return res


def _np_dtype(dtype: DType):
    return np.float64 if dtype.is_float else dtype.numpy


class NumpyBackend:
    """float64 values through the op table's numpy semantics (the reference interpreter's)."""

    def __init__(self, leaves: dict[str, np.ndarray], fd_step: float = 1e-6):
        self.leaves = leaves
        self.fd_step = fd_step

    def leaf(self, name):
        return self.leaves[name]

    def const(self, value, dtype: DType):
        return np.asarray(value, dtype=_np_dtype(dtype))

    def op(self, op, args, attrs, rtype):
        if op == "dataTypeCast" and attrs["dtype"].is_float:
            attrs = dict(attrs, dtype=DType.f64)
        with np.errstate(all="ignore"):
            out = np.asarray(OPS[op].evaluate(args, attrs))
        return out.astype(_np_dtype(rtype.dtype), copy=False)

    def vjp(self, op, args, attrs, rtype, i, g):
        """Central differences along each element of operand i."""
        a = np.array(args[i], dtype=np.float64)
        res = np.zeros(a.shape)
        h = self.fd_step
        for k in np.ndindex(a.shape):
            up, down = a.copy(), a.copy()
            up[k] += h
            down[k] -= h
            f_up = self.op(op, args[:i] + [up] + args[i + 1 :], attrs, rtype)
            f_down = self.op(op, args[:i] + [down] + args[i + 1 :], attrs, rtype)
            res[k] = np.sum(g * (f_up - f_down) / (2 * h))
        return res


# ---------------------------------------------------------------- the evaluator


class Evaluator:
    """Types and values of terms under an assignment {variable: TensorType or primitive}.

    `memo` arguments cache types (and primitive values) of subterms for one assignment."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self.sigs = vocab.sigs
        self._split: dict = {}
        self._term_sorts: set | None = None  # sorts of tensor-valued children (Term, Scalar)
        self._result: dict = {}  # (constructor, child types, primitives) -> type or error

    def split(self, t: PCall) -> tuple[list, list]:
        """(tensor children, primitive children) of a constructor application."""
        hit = self._split.get(t)
        if hit is None:
            sig = self.sigs[t.head]
            if self._term_sorts is None:
                self._term_sorts = self.vocab.term_sorts()
            terms, prims = [], []
            for a, s in zip(t.args, sig.args):
                (terms if s == sig.result or s in self._term_sorts else prims).append(a)
            hit = self._split[t] = (terms, prims)
        return hit

    # -------------------------------------------------- primitives
    def prim(self, e, asg: dict, memo: dict | None = None):
        if isinstance(e, PLit):
            return e.value
        if isinstance(e, PVar):
            v = asg[e.name]
            if isinstance(v, TensorType):
                raise Untypable(f"{e.name} is a term, not a primitive")
            return v
        memo = {} if memo is None else memo
        key = ("prim", e)
        if key in memo:
            return memo[key]
        v = memo[key] = self._prim(e, asg, memo)
        return v

    def _prim(self, e, asg, memo):
        if e.head == "shape":
            return self.type(e.args[0], asg, memo).shape
        if e.head == "dtype":
            return str(self.type(e.args[0], asg, memo).dtype)
        fn = PRIM_FNS.get(e.head) or self.vocab.function(e.head)
        if fn is None:
            raise Untypable(f"{e.head} is not a primitive")
        args = [self.prim(a, asg, memo) for a in e.args]
        try:
            return fn(*args)
        except (
            TypeError,
            ValueError,
            OverflowError,
            ZeroDivisionError,
            KeyError,
            HelperTypeError,
        ) as err:
            raise Untypable(f"{pshow(e)}: {err}") from None

    def holds(self, guard, asg: dict, memo: dict | None = None) -> bool:
        try:
            return bool(self.prim(guard, asg, memo))
        except Untypable:
            return False

    # -------------------------------------------------- types
    def type(self, e, asg: dict, memo: dict | None = None) -> TensorType:
        if isinstance(e, PVar):
            v = asg.get(e.name)
            if not isinstance(v, TensorType):
                raise Untypable(f"{e.name} is not a tensor")
            return v
        memo = {} if memo is None else memo
        t = memo.get(e)
        if t is None:
            t = memo[e] = self._type(e, asg, memo)
        return t

    def _type(self, e, asg, memo) -> TensorType:
        if not isinstance(e, PCall) or e.head not in self.sigs:
            raise Untypable(f"{pshow(e)} is not a term")
        if e.head == "Const":
            v, d = (self.prim(a, asg, memo) for a in e.args)
            try:
                dtype = DType(d)
            except ValueError:
                raise Untypable(f"unknown dtype {d!r}") from None
            check_constant(v, dtype)
            return TensorType((), dtype)
        if e.head == "Adjoint":
            i, fwd, g = self._adjoint_parts(e, asg, memo)
            kids, _ = self.split(fwd)
            ft = self.type(fwd, asg, memo)
            if not ft.dtype.is_float:
                raise Untypable(f"{fwd.head} gives {ft}: only float results have adjoints")
            gt = self.type(g, asg, memo)
            if gt != ft:
                raise Untypable(f"the cotangent has type {gt}, the term {ft}")
            if not 0 <= i < len(kids):
                raise Untypable(f"{fwd.head} has no operand {i}")
            at = self.type(kids[i], asg, memo)
            if not at.dtype.is_float:
                raise Untypable(f"operand {i} of {fwd.head} is not a float tensor")
            return at
        kids, prims = self.split(e)
        kid_types = [self.type(k, asg, memo) for k in kids]
        prim_values = [self.prim(p, asg, memo) for p in prims]
        key = (e.head, tuple(kid_types), tuple(prim_values))
        try:
            hit = self._result.get(key)
        except TypeError:  # an unhashable primitive (a list): no caching
            return self._result_type(e, kid_types, prim_values)
        if hit is None:
            try:
                hit = self._result[key] = self._result_type(e, kid_types, prim_values)
            except Untypable as err:  # kept unformatted: most are never read
                hit = self._result[key] = err.with_traceback(None)
        if isinstance(hit, Untypable):
            raise Untypable(*hit.args)
        return hit

    def _result_type(self, e, kid_types, prim_values) -> TensorType:
        """The type of constructor e from its children's types and primitive values."""
        helper = self.vocab.helper(e.head)
        if helper is not None:
            try:
                return helper.type(kid_types, prim_values)
            except (HelperTypeError, TypeError, ValueError, IndexError) as err:
                raise Untypable(f"{e.head}: {err}") from None
        ctor = self.vocab.ir_ctor(e.head)
        if ctor is None:
            raise Untypable(f"{e.head} has no IR op")
        op = EGG_TO_OP[ctor]
        attrs = ctor_attrs(ctor, prim_values)
        spec = OPS[op]
        if spec.kind in ELEMENTWISE_KINDS:  # cheap rejections before the op table's messages
            if len({t.shape for t in kid_types}) > 1:
                raise Untypable(
                    f"{e.head} operands have different shapes "
                    + ", ".join(map(str, kid_types))
                    + " (broadcasts are explicit)"
                )
            data = kid_types[:2] if spec.kind == SELECT else kid_types
            if len({t.dtype for t in data}) > 1 or (spec.float_only and not data[0].dtype.is_float):
                raise Untypable(f"{e.head}: operand dtypes " + ", ".join(map(str, kid_types)))
        try:
            return spec.result_type(kid_types, attrs)
        except DlvmError as err:
            raise Untypable(err.with_traceback(None)) from None  # formatted when read

    def _adjoint_parts(self, e: PCall, asg, memo=None):
        sig = self.sigs["Adjoint"]
        idx = [a for a, s in zip(e.args, sig.args) if s == "i64"]
        terms = [a for a, s in zip(e.args, sig.args) if s == sig.result]
        if len(idx) != 1 or len(terms) != 2:
            raise Untypable("Adjoint must be declared (Adjoint i64 Term Term)")
        fwd = terms[0]
        if not isinstance(fwd, PCall) or fwd.head not in EGG_TO_OP:
            raise Untypable(f"the adjoint of {pshow(fwd)}: only IR ops have adjoints")
        return int(self.prim(idx[0], asg, memo)), fwd, terms[1]

    # -------------------------------------------------- values
    def value(self, e, asg: dict, backend, memo: dict | None = None, types: dict | None = None):
        """The value of term e; `memo` caches values (one backend and point), `types` types."""
        memo = {} if memo is None else memo
        types = memo.setdefault("?types", {}) if types is None else types
        if e in memo:
            return memo[e]
        v = memo[e] = self._value(e, asg, backend, memo, types)
        return v

    def _value(self, e, asg, backend, memo, types):
        if isinstance(e, PVar):
            return backend.leaf(e.name)
        if e.head == "Const":
            v, d = (self.prim(a, asg, types) for a in e.args)
            return backend.const(v, DType(d))
        if e.head == "Adjoint":
            i, fwd, g = self._adjoint_parts(e, asg, types)
            kids, prims = self.split(fwd)
            args = [self.value(k, asg, backend, memo, types) for k in kids]
            attrs = ctor_attrs(fwd.head, [self.prim(p, asg, types) for p in prims])
            return backend.vjp(
                EGG_TO_OP[fwd.head],
                args,
                attrs,
                self.type(fwd, asg, types),
                i,
                self.value(g, asg, backend, memo, types),
            )
        kids, prims = self.split(e)
        args = [self.value(k, asg, backend, memo, types) for k in kids]
        prim_values = [self.prim(p, asg, types) for p in prims]
        rtype = self.type(e, asg, types)
        helper = self.vocab.helper(e.head)
        if helper is not None:
            return as_array(helper.value(backend, args, prim_values, rtype))
        ctor = self.vocab.ir_ctor(e.head)
        attrs = ctor_attrs(ctor, prim_values)
        return as_array(backend.op(EGG_TO_OP[ctor], args, attrs, rtype))
