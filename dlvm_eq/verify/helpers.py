"""Reference meanings of the helper vocabulary that rule files build on, beyond the IR ops.

The shipped rule files declare helper constructors (rules/adjoint.egg: `Like`, `Fill`,
`SumTo`, ...; rules/algebra.egg: `Gemm`; rules/fusion.egg: `Load`, `Map`, `ReduceMap`) and
analysis functions (`cval`) and define them by rewrites. verify-rules gives
each one an independent meaning here, so that the rules expanding a helper are checked like
any other rule, and rules using it can be checked.
A helper declared with other argument sorts than listed here is treated as unknown (its rules
are skipped, with that reason).

    HELPERS["SumTo"].type([TensorType((2, 3), F32)], [(2, 3), (3,)])   # <3 x f32>
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import DlvmError
from ..ir.ops import OPS, REDUCE_COMBINATORS
from ..ir.types import DType, TensorType, broadcast_shapes


class HelperTypeError(Exception):
    """The helper is not defined for these arguments."""


@dataclass(frozen=True)
class Helper:
    args: tuple[str, ...]  # declared sorts, in order
    doc: str
    type: Callable  # (tensor types, primitives) -> TensorType
    value: Callable  # (backend, tensors, primitives, result type) -> array
    hints: Callable | None = None  # (primitive index, first tensor's type) -> candidates


def _dtype(d) -> DType:
    try:
        return DType(d)
    except ValueError:
        raise HelperTypeError(f"unknown dtype {d!r}") from None


def _need(cond: bool, msg: str):
    if not cond:
        raise HelperTypeError(msg)


def _shape(s) -> tuple[int, ...]:
    s = tuple(int(d) for d in s)
    _need(all(d >= 1 for d in s), f"shape {s} has a dimension below 1")
    return s


def _fill(be, v, d: DType, shape):
    c = be.const(v, d)
    if not shape:
        return c
    return be.op("broadcast", [c], {"shape": tuple(shape)}, TensorType(tuple(shape), d))


def _reduce_to(be, g, axes, keep_shape, dtype):
    """Sum g over `axes`, then reshape to keep_shape."""
    if not axes:
        return g
    left = tuple(d for i, d in enumerate(g.shape) if i not in axes)
    r = be.op(
        "reduce",
        [g],
        {"combinator": "add", "init": 0.0, "axes": tuple(axes)},
        TensorType(left, dtype),
    )
    return be.op(
        "shapeCast", [r], {"shape": tuple(keep_shape)}, TensorType(tuple(keep_shape), dtype)
    )


def _unit_variants(shape):
    """Every shape that broadcasts to `shape` (a suffix, with some dims replaced by 1)."""
    out = []
    for lead in range(len(shape) + 1):
        suffix = shape[lead:]
        for mask in itertools.product((False, True), repeat=len(suffix)):
            out.append(tuple(1 if m else d for d, m in zip(suffix, mask)))
    return list(dict.fromkeys(out))


def _perms(t):
    return [tuple(p) for p in itertools.permutations(range(t.rank))]


# ---------------------------------------------------------------- Fill, Like
def _constant_ok(v, d: DType):
    _need(d is not DType.bool or float(v) in (0.0, 1.0), f"a bool fill value is 0 or 1, not {v}")
    _need(d is not DType.i32 or float(v).is_integer(), f"an i32 fill value is an integer, not {v}")


def _fill_type(ts, ps):
    v, d, s = ps
    d = _dtype(d)
    _constant_ok(v, d)
    return TensorType(_shape(s), d)


def _like_type(ts, ps):
    _constant_ok(ps[0], ts[0].dtype)
    return ts[0]


def _float(t: TensorType, who: str) -> TensorType:
    """Helpers that carry adjoints (cotangents) are only built on float tensors."""
    _need(t.dtype.is_float, f"{who} carries adjoints: it takes a float tensor, not {t}")
    return t


# ---------------------------------------------------------------- SumTo, SumAxes
def _sum_to_type(ts, ps):
    (g,), (t, s) = ts, ps
    t, s = _shape(t), _shape(s)
    _float(g, "SumTo")
    _need(g.shape == t, f"SumTo: the term has shape {g.shape}, not {t}")
    _need(len(s) <= len(t) and broadcast_shapes(s, t) == t, f"SumTo: {s} does not broadcast to {t}")
    return TensorType(s, g.dtype)


def _sum_to(be, terms, ps, rt):
    (g,), (t, s) = terms, ps
    lead = len(t) - len(s)
    axes = list(range(lead)) + [lead + j for j in range(len(s)) if s[j] == 1 and t[lead + j] != 1]
    return _reduce_to(be, g, axes, s, rt.dtype)


def _sum_axes_parts(ts, ps):
    (g,), (t, s, k) = ts, ps
    t, s = _shape(t), _shape(s)
    _float(g, "SumAxes")
    _need(g.shape == t, f"SumAxes: the term has shape {g.shape}, not {t}")
    _need(
        len(s) == len(t) and broadcast_shapes(s, t) == t, f"SumAxes: {s} does not broadcast to {t}"
    )
    _need(0 <= k <= len(t), f"SumAxes: axis bound {k} out of range")
    axes = [j for j in range(k) if s[j] == 1 and t[j] != 1]
    return axes, tuple(1 if j in axes else d for j, d in enumerate(t))


def _sum_axes_type(ts, ps):
    _, shape = _sum_axes_parts(ts, ps)
    return TensorType(shape, ts[0].dtype)


def _sum_axes(be, terms, ps, rt):
    axes, shape = _sum_axes_parts([TensorType(terms[0].shape, rt.dtype)], ps)
    return _reduce_to(be, terms[0], axes, shape, rt.dtype)


def _sum_hints(i, t):
    if t is None:
        return None
    if i == 0:
        return [t.shape]
    if i == 1:
        return _unit_variants(t.shape)
    return list(range(t.rank + 1))


def _sum_axes_hints(i, t):
    if t is None:
        return None
    if i == 1:
        return [s for s in _unit_variants(t.shape) if len(s) == t.rank]
    return _sum_hints(i, t)


# ---------------------------------------------------------------- TransposeBack
def _transpose_back_perm(ts, ps):
    (g,), (p, q, i) = ts, ps
    p, q = tuple(p), tuple(q)
    _float(g, "TransposeBack")
    _need(sorted(p) == list(range(g.rank)), f"TransposeBack: {p} is not a permutation")
    _need(len(q) == g.rank, f"TransposeBack: {q} has not {g.rank} entries")
    _need(0 <= i <= len(p), f"TransposeBack: step {i} out of range")
    out = list(q)
    for j in range(i, len(p)):  # q[p[j]] = j for the steps still to do
        out[p[j]] = j
    _need(sorted(out) == list(range(g.rank)), f"TransposeBack: {out} is not a permutation")
    return tuple(out)


def _transpose_back_type(ts, ps):
    perm = _transpose_back_perm(ts, ps)
    return ts[0].with_shape(tuple(ts[0].shape[a] for a in perm))


def _transpose_back(be, terms, ps, rt):
    perm = _transpose_back_perm([TensorType(terms[0].shape, rt.dtype)], ps)
    return be.op("transpose", [terms[0]], {"perm": perm}, rt)


def _transpose_back_hints(i, t):
    if t is None:
        return None
    return _perms(t) if i < 2 else list(range(t.rank + 1))


# ---------------------------------------------------------------- PadFront, PadBack
def _pad_type(ts, ps):
    (x,), (k, r) = ts, ps
    _float(x, "PadFront/PadBack")
    _need(0 <= k < x.rank and r >= 0, f"pad: axis {k} / count {r} out of range for {x}")
    return x.with_shape(x.shape[:k] + (x.shape[k] + r,) + x.shape[k + 1 :])


def _pad(front: bool):
    def value(be, terms, ps, rt):
        (x,), (k, r) = terms, ps
        if r == 0:
            return x
        zeros = _fill(be, 0.0, rt.dtype, x.shape[:k] + (r,) + x.shape[k + 1 :])
        parts = [zeros, x] if front else [x, zeros]
        return be.op("concatenate", parts, {"axis": k}, rt)

    return value


def _axis_hints(i, t):
    if t is None:
        return None
    return list(range(t.rank)) if i == 0 else None


# ---------------------------------------------------------------- Gemm
def _gemm_operands(ts, ps):
    a, b = ts
    ta, tb = ps
    _need(ta in (0, 1) and tb in (0, 1), "Gemm: flags must be 0 or 1")
    if ta:
        _need(a.rank == 2, "Gemm: a transposed operand must be a matrix")
        a = a.with_shape(a.shape[::-1])
    if tb:
        _need(b.rank == 2, "Gemm: a transposed operand must be a matrix")
        b = b.with_shape(b.shape[::-1])
    return a, b


def _gemm_type(ts, ps):
    a, b = _gemm_operands(ts, ps)
    try:
        return OPS["dot"].result_type([a, b], {})
    except Exception as e:
        raise HelperTypeError(str(e)) from None


def _gemm(be, terms, ps, rt):
    a, b = terms
    ta, tb = ps
    if ta:
        a = be.op("transpose", [a], {"perm": (1, 0)}, TensorType(a.shape[::-1], rt.dtype))
    if tb:
        b = be.op("transpose", [b], {"perm": (1, 0)}, TensorType(b.shape[::-1], rt.dtype))
    return be.op("dot", [a, b], {}, rt)


# ---------------------------------------------------------------- the scalar sub-language
# rules/fusion.egg: a Scalar is an element expression evaluated at every index of its shape,
# i.e. a tensor. (Load t) reads t at the current index and (Map s) is the tensor whose every
# element is s: both are the identity on values. The scalar ops S<op> are the IR ops
# (pattern.Vocab.ir_ctor); (ReduceMap s c i axes) is (Reduce s c i) over the axes in the vector.
def _identity_type(ts, ps):
    return ts[0]


def _identity(be, ts, ps, rt):
    return ts[0]


def _reduce_map_attrs(ps):
    c, init, axes = ps
    return {"combinator": str(c), "init": float(init), "axes": tuple(int(a) for a in axes)}


def _reduce_map_type(ts, ps):
    try:
        return OPS["reduce"].result_type(list(ts), _reduce_map_attrs(ps))
    except DlvmError as e:
        raise HelperTypeError(str(e)) from None


def _reduce_map(be, ts, ps, rt):
    return be.op("reduce", [ts[0]], _reduce_map_attrs(ps), rt)


def _reduce_map_hints(i, t):
    if i == 0:
        return list(REDUCE_COMBINATORS)
    if i == 2 and t is not None:
        return [
            tuple(a) for r in range(1, t.rank + 1) for a in itertools.combinations(range(t.rank), r)
        ]
    return None


HELPERS: dict[str, Helper] = {
    "Load": Helper(
        ("Term",),
        "tensor t read at the current index (as a tensor: t itself)",
        _identity_type,
        _identity,
    ),
    "Map": Helper(
        ("Scalar",), "the tensor whose every element is s (s itself)", _identity_type, _identity
    ),
    "ReduceMap": Helper(
        ("Scalar", "String", "f64", "IVec"),
        "(Reduce s c init) over the axes of the vector",
        _reduce_map_type,
        _reduce_map,
        _reduce_map_hints,
    ),
    "Fill": Helper(
        ("f64", "String", "IVec"),
        "v with dtype d and shape s",
        _fill_type,
        lambda be, ts, ps, rt: _fill(be, ps[0], rt.dtype, rt.shape),
    ),
    "Like": Helper(
        ("f64", "Term"),
        "v with the shape and dtype of x",
        _like_type,
        lambda be, ts, ps, rt: _fill(be, ps[0], rt.dtype, rt.shape),
    ),
    "SumTo": Helper(
        ("Term", "IVec", "IVec"),
        "g of shape t summed to shape s (numpy broadcasting in reverse)",
        _sum_to_type,
        _sum_to,
        _sum_hints,
    ),
    "SumAxes": Helper(
        ("Term", "IVec", "IVec", "i64"),
        "g of shape t summed over the axes j < k where s has 1 and t not (kept as 1)",
        _sum_axes_type,
        _sum_axes,
        _sum_axes_hints,
    ),
    "TransposeBack": Helper(
        ("Term", "IVec", "IVec", "i64"),
        "g transposed by q, with q[p[j]] = j "
        "for the steps j >= i (from q = p, i = 0: the inverse of p)",
        _transpose_back_type,
        _transpose_back,
        _transpose_back_hints,
    ),
    "PadFront": Helper(
        ("Term", "i64", "i64"),
        "x with r zeros before it along axis k",
        _pad_type,
        _pad(True),
        _axis_hints,
    ),
    "PadBack": Helper(
        ("Term", "i64", "i64"),
        "x with r zeros after it along axis k",
        _pad_type,
        _pad(False),
        _axis_hints,
    ),
    "Gemm": Helper(
        ("Term", "Term", "i64", "i64"),
        "op(a) . op(b), op = transpose where the flag is 1",
        _gemm_type,
        _gemm,
        lambda i, t: [0, 1],
    ),
}


# ---------------------------------------------------------------- Once, StepOf (rules/loops.egg)
# In a loop body, (Once s n v) is v, computed before the loop, and (StepOf s n v) is row t of v
# at step t, v having n rows. The rules must hold at every step; nothing in them depends on t,
# so the check takes one row, the last.
def _step_type(ts, ps):
    (x,) = ts
    _need(x.rank >= 1 and x.shape[0] == int(ps[1]), "StepOf: v has a row per step (n rows)")
    return x.with_shape(x.shape[1:])


def _step(be, terms, ps, rt):
    (x,) = terms
    t = int(ps[1]) - 1
    row = be.op("slice", [x], {"axis": 0, "lo": t, "hi": t + 1}, rt.with_shape((1, *rt.shape)))
    return be.op("shapeCast", [row], {"shape": rt.shape}, rt)


HELPERS["Once"] = Helper(
    ("String", "i64", "Term"),
    "v, computed once before a loop",
    lambda ts, ps: ts[0],
    lambda be, terms, ps, rt: terms[0],
)
HELPERS["StepOf"] = Helper(
    ("String", "i64", "Term"),
    "row t of v (n rows) at step t of a loop of n steps (checked at the last row)",
    _step_type,
    _step,
)


# ---------------------------------------------------------------- Cond, Case, ScanOf (rules/loops.egg)
# A region's results in its caller's e-graph: (Cond c a b) is a where the scalar bool c holds,
# else b; (Case k i a b) is a where the scalar k <= i, else b (a switch is a chain of them);
# (ScanOf n r x) is what a scan of n steps gives when its body run once gives x, modelled at
# one step only (the lemma `scan-one-step` states).
def _branches_type(ts, mask_ok):
    m, a, b = ts
    _need(m.rank == 0 and mask_ok(m), "the selector is a scalar of the right dtype")
    _need(a == b, "both branches have one type")
    return a


def _mask(be, m, rt):
    if not rt.shape:
        return m
    return be.op("broadcast", [m], {"shape": rt.shape}, rt.with_dtype(DType.bool))


def _case(be, terms, ps, rt):
    k, a, b = terms
    i = be.const(int(ps[0]), DType.i32)
    le = be.op("lessThanOrEqual", [k, i], {}, TensorType((), DType.bool))
    return be.op("select", [a, b, _mask(be, le, rt)], {}, rt)


def _scan_of_type(ts, ps):
    _need(int(ps[0]) == 1, "ScanOf is modelled at one step")
    return ts[0]


HELPERS["Cond"] = Helper(
    ("Term", "Term", "Term"),
    "a where the scalar c is true, else b (a cond's results)",
    lambda ts, ps: _branches_type(ts, lambda m: m.dtype == DType.bool),
    lambda be, terms, ps, rt: be.op(
        "select", [terms[1], terms[2], _mask(be, terms[0], rt)], {}, rt
    ),
)
HELPERS["Case"] = Helper(
    ("Term", "i64", "Term", "Term"),
    "a where the scalar k <= i, else b (a switch is a chain of them)",
    lambda ts, ps: _branches_type(ts, lambda m: m.dtype != DType.bool),
    _case,
    lambda i, t: [0, 1, 2],
)
HELPERS["ScanOf"] = Helper(
    ("i64", "i64", "Term"),
    "the results of a scan of n steps whose body run once gives x (modelled at n = 1)",
    _scan_of_type,
    lambda be, terms, ps, rt: terms[0],
    lambda i, t: [1, 2] if i == 0 else [0, 1],
)


# primitive-valued functions: name -> (declared argument sorts, result sort, implementation)
# (none at present: the slice op replaced prefix-size; pattern.py and rules.py read this table)
FUNCTIONS: dict[str, tuple[tuple[str, ...], str, Callable]] = {}
