"""The op table: the single source of truth for the op set.

Every later stage reads it: the parser and printer (spelling, attributes), the verifier and
builders (result-type rule), the interpreter (numpy semantics), the e-graph schema (constructor
names, `egg`), the adjoint rules and codegen (kind). One `OpSpec` per op, keyed by DLVM name.

    >>> OPS["add"].result_type([tensor(2, 3, F32), scalar(F32)], {})
    TensorType(shape=(2, 3), dtype=<DType.f32: 'f32'>)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import IRError
from . import attention_op, control_flow, window_ops
from .types import BOOL, DType, TensorType, TupleType, Type, broadcast_shapes, scalar, tensor  # noqa: F401

# Kinds group ops that every stage treats alike.
UNARY, BINARY, COMPARE, LOGIC, SELECT = "unary", "binary", "compare", "logic", "select"
ELEMENTWISE_KINDS = (UNARY, BINARY, COMPARE, LOGIC, SELECT)
REDUCE, DOT, LAYOUT, CAST, LITERAL, TUPLE, CALL = (
    "reduce",
    "dot",
    "layout",
    "cast",
    "literal",
    "tuple",
    "call",
)
# A slice keeps part of its operand: not a LAYOUT view (views keep every element, and code that
# fuses views into reads relies on that); codegen copies it out of a buffer, like concatenate.
SLICE = "slice"
# take and scatterAdd read or write along an axis at integer indices (a plan step of their own:
# compiled index kernels on the CPU, codegen/runtime/index_kernel.py)
GATHER = "gather"
SCAN = "scan"  # cumsum: a plan step of its own (a compiled line scan on the CPU)
# convolution and pooling (window_ops.py): a sliding window over the two trailing axes
WINDOW = "window"
# scan, while, cond, switch (control_flow.py): bodies are functions; never in the e-graph
CONTROL = "control"
ATTENTION = "attention"  # fused softmax(q kᵀ s + bias) v (attention_op.py): a plan step of its own

REDUCE_COMBINATORS = {"add": np.add, "multiply": np.multiply, "max": np.maximum, "min": np.minimum}


@dataclass(frozen=True)
class OpSpec:
    name: str  # DLVM spelling, e.g. "add", "shapeCast"
    kind: str  # UNARY, BINARY, ... (see above)
    arity: int | None  # None: variadic
    egg: str  # e-graph constructor in rules/schema.egg
    result_type: Callable[[list[Type], dict], Type]
    evaluate: Callable[..., Any]  # numpy semantics: evaluate(args, attrs) -> array
    attrs: tuple[str, ...] = ()  # attribute names, in printed order
    float_only: bool = False  # operands must be f32/f64
    differentiable: bool = True  # has a derivative (may be zero) in its float operands
    nondiff_operands: tuple[int, ...] = field(default=())  # operands with no adjoint (masks)


def _fail(op: str, msg: str):
    raise IRError(f"{op}: {msg}")


def _tensors(op: str, types: list[Type]) -> list[TensorType]:
    for t in types:
        if not isinstance(t, TensorType):
            _fail(op, f"expected tensor operands, got tuple {t}")
    return types  # type: ignore[return-value]


def _elementwise_type(
    op: str,
    types: list[Type],
    out_dtype: DType | None = None,
    float_only: bool = False,
    bool_only: bool = False,
) -> TensorType:
    ts = _tensors(op, types)
    dtypes = {t.dtype for t in ts}
    if len(dtypes) != 1:
        _fail(op, "operands have different data types: " + ", ".join(str(t) for t in ts))
    dtype = dtypes.pop()
    if float_only and not dtype.is_float:
        _fail(op, f"expected a floating-point operand, got {dtype}")
    if bool_only and dtype is not BOOL:
        _fail(op, f"expected bool operands, got {dtype}")
    if not bool_only and not float_only and dtype is BOOL and out_dtype is None:
        _fail(op, "arithmetic on bool operands; cast them with dataTypeCast first")
    shape = broadcast_shapes(*(t.shape for t in ts))
    if shape is None:
        _fail(op, "shapes do not broadcast: " + ", ".join(str(t) for t in ts))
    return TensorType(shape, out_dtype or dtype)


def _int_divide(a, b):
    # C-style truncating division, as LLVM's sdiv does; division by zero gives 0 rather than trapping.
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.trunc(np.true_divide(a, np.where(b == 0, 1, b)))
    return np.where(b == 0, 0, q).astype(np.result_type(a, b))


def _divide(args, attrs):
    a, b = args
    if np.issubdtype(np.result_type(a, b), np.integer):
        return _int_divide(a, b)
    return np.divide(a, b)


def _rsqrt(x):
    return 1.0 / np.sqrt(x)


def _relu(x):
    return np.maximum(x, np.zeros((), x.dtype))


def _softplus(x):
    return np.logaddexp(np.zeros((), x.dtype), x)


def _sigmoid(x):
    from scipy.special import expit  # imported on first use: scipy costs ~0.2 s to import

    return expit(x)


def _erf(x):
    from scipy.special import erf

    return erf(x)


# name -> numpy function; all are float ops except the ones listed in _INT_OK_UNARY
_UNARY_FNS: dict[str, Callable] = {
    "negate": np.negative,
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "sqrt": np.sqrt,
    "rsqrt": _rsqrt,
    "square": np.square,
    "sign": np.sign,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.rint,
    "abs": np.abs,
    # extensions of DLVM's op set
    "sigmoid": _sigmoid,
    "relu": _relu,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "softplus": _softplus,
    "erf": _erf,  # issue 14 part B
}
_INT_OK_UNARY = {"negate", "square", "sign", "abs", "relu"}
# piecewise constant: the derivative is zero almost everywhere, so no adjoint flows to the operand
_PIECEWISE_CONSTANT = {"sign", "floor", "ceil", "round"}

_BINARY_FNS: dict[str, Callable] = {
    "add": lambda a, b: np.add(a, b),
    "subtract": lambda a, b: np.subtract(a, b),
    "multiply": lambda a, b: np.multiply(a, b),
    "power": lambda a, b: np.power(a, b),
    "min": lambda a, b: np.minimum(a, b),
    "max": lambda a, b: np.maximum(a, b),
}
_COMPARE_FNS: dict[str, Callable] = {
    "equal": np.equal,
    "notEqual": np.not_equal,
    "lessThan": np.less,
    "lessThanOrEqual": np.less_equal,
    "greaterThan": np.greater,
    "greaterThanOrEqual": np.greater_equal,
}
_LOGIC_FNS: dict[str, Callable] = {"and": np.logical_and, "or": np.logical_or}

_PASCAL = lambda name: name[0].upper() + name[1:]


def _errstate(fn):
    def run(*args):
        with np.errstate(all="ignore"):
            return fn(*args)

    return run


# ---------------------------------------------------------------- non-elementwise type rules


def _dot_type(types, attrs):
    a, b = _tensors("dot", types)
    if a.dtype != b.dtype:
        _fail("dot", f"operands have different data types: {a}, {b}")
    if a.dtype is BOOL:
        _fail("dot", "bool operands")
    if a.rank not in (1, 2) or b.rank not in (1, 2):
        _fail("dot", f"expected vectors or matrices, got {a} and {b}")
    k_a = a.shape[-1]
    k_b = b.shape[0]
    if k_a != k_b:
        _fail("dot", f"contracted dimensions differ: {a} · {b} ({k_a} vs {k_b})")
    return TensorType(a.shape[:-1] + b.shape[1:], a.dtype)


def transpose_perm(rank: int, attrs: dict) -> tuple[int, ...]:
    perm = attrs.get("perm")
    return tuple(perm) if perm is not None else tuple(reversed(range(rank)))


def _transpose_type(types, attrs):
    (a,) = _tensors("transpose", types)
    perm = transpose_perm(a.rank, attrs)
    if sorted(perm) != list(range(a.rank)):
        _fail("transpose", f"{list(perm)} is not a permutation of the {a.rank} axes of {a}")
    return a.with_shape(tuple(a.shape[p] for p in perm))


def _reduce_type(types, attrs):
    (a,) = _tensors("reduce", types)
    axes = tuple(attrs["axes"])
    if attrs["combinator"] not in REDUCE_COMBINATORS:
        _fail(
            "reduce",
            f"unknown combinator {attrs['combinator']!r}; expected one of "
            + ", ".join(REDUCE_COMBINATORS),
        )
    if len(set(axes)) != len(axes) or any(not 0 <= ax < a.rank for ax in axes):
        _fail("reduce", f"axes {list(axes)} are not distinct axes of {a}")
    return a.with_shape(tuple(d for i, d in enumerate(a.shape) if i not in axes))


def _shape_cast_type(types, attrs):
    (a,) = _tensors("shapeCast", types)
    shape = tuple(attrs["shape"])
    if int(np.prod(shape, dtype=np.int64)) != a.size:
        _fail("shapeCast", f"cannot cast {a} ({a.size} elements) to shape {shape}")
    return a.with_shape(shape)


def _pad_shape_type(types, attrs):
    (a,) = _tensors("padShape", types)
    at = attrs["at"]
    if not 0 <= at <= a.rank:
        _fail("padShape", f"axis {at} out of range for {a}")
    return a.with_shape(a.shape[:at] + (1,) + a.shape[at:])


def _squeeze_shape_type(types, attrs):
    (a,) = _tensors("squeezeShape", types)
    at = attrs["at"]
    if not 0 <= at < a.rank or a.shape[at] != 1:
        _fail("squeezeShape", f"axis {at} of {a} is not of size 1")
    return a.with_shape(a.shape[:at] + a.shape[at + 1 :])


def _broadcast_type(types, attrs):
    (a,) = _tensors("broadcast", types)
    shape = tuple(attrs["shape"])
    if broadcast_shapes(a.shape, shape) != shape:
        _fail("broadcast", f"cannot broadcast {a} to shape {shape}")
    return a.with_shape(shape)


def _cast_type(types, attrs):
    (a,) = _tensors("dataTypeCast", types)
    return a.with_dtype(attrs["dtype"])


def _concatenate_type(types, attrs):
    ts = _tensors("concatenate", types)
    if not ts:
        _fail("concatenate", "expected at least one operand")
    axis = attrs["axis"]
    first = ts[0]
    if not 0 <= axis < first.rank:
        _fail("concatenate", f"axis {axis} out of range for {first}")
    for t in ts[1:]:
        if (
            t.dtype != first.dtype
            or t.rank != first.rank
            or any(t.shape[i] != first.shape[i] for i in range(t.rank) if i != axis)
        ):
            _fail("concatenate", f"operands {first} and {t} differ outside axis {axis}")
    total = sum(t.shape[axis] for t in ts)
    return first.with_shape(first.shape[:axis] + (total,) + first.shape[axis + 1 :])


def _slice_type(types, attrs):
    (a,) = _tensors("slice", types)
    k, lo, hi, step = attrs["axis"], attrs["lo"], attrs["hi"], attrs.get("step", 1)
    if not 0 <= k < a.rank:
        _fail("slice", f"axis {k} out of range for {a}")
    if not 0 <= lo < hi <= a.shape[k]:
        _fail(
            "slice", f"range {lo} to {hi} is empty or outside axis {k} of {a} (0 to {a.shape[k]})"
        )
    if step < 1:
        _fail("slice", f"step {step} is not positive")
    return a.with_shape(a.shape[:k] + (len(range(lo, hi, step)),) + a.shape[k + 1 :])


def slice_index(rank: int, attrs: dict) -> tuple:
    """The numpy index of a slice op: x[slice_index(x.ndim, attrs)]."""
    return (
        (slice(None),) * attrs["axis"]
        + (slice(attrs["lo"], attrs["hi"], attrs.get("step", 1)),)
        + (slice(None),) * (rank - attrs["axis"] - 1)
    )


def _select_type(types, attrs):
    a, b, m = _tensors("select", types)
    if m.dtype is not BOOL:
        _fail("select", f"the mask must be bool, got {m}")
    if a.dtype != b.dtype:
        _fail("select", f"operands have different data types: {a}, {b}")
    shape = broadcast_shapes(a.shape, b.shape, m.shape)
    if shape is None:
        _fail("select", f"shapes do not broadcast: {a}, {b}, mask {m}")
    return TensorType(shape, a.dtype)


def _extract_type(types, attrs):
    (t,) = types
    i = attrs["index"]
    if not isinstance(t, TupleType):
        _fail("extract", f"expected a tuple operand, got {t}")
    if not 0 <= i < len(t.elements):
        _fail("extract", f"index {i} out of range for {t}")
    return t.elements[i]


def _literal_type(types, attrs):
    t = attrs["type"]
    value = np.asarray(attrs["value"])
    if value.ndim and value.shape != t.shape:
        _fail("literal", f"array literal of shape {value.shape} does not match {t}")
    return t


def _tuple_type(types, attrs):
    return TupleType(tuple(_tensors("literal", types)))


def _apply_type(types, attrs):
    return attrs["type"]


def _reduce(args, attrs):
    (x,) = args
    fn = REDUCE_COMBINATORS[attrs["combinator"]]
    axes = tuple(attrs["axes"])
    init = np.asarray(attrs["init"], dtype=x.dtype)
    if not axes:
        return fn(x, init)
    return fn.reduce(x, axis=axes, initial=init[()]).astype(x.dtype, copy=False)


def _literal(args, attrs):
    t = attrs["type"]
    return np.broadcast_to(np.asarray(attrs["value"], dtype=t.dtype.numpy), t.shape).copy()


def _cast(args, attrs):
    return args[0].astype(attrs["dtype"].numpy)


def _unevaluable(args, attrs):
    raise IRError("apply must be inlined or evaluated by the interpreter")


# ---------------------------------------------------------------- issue 14 part B: batched matmul, ...
# (own block: the conv/pool rows live in theirs)


def _batch_matmul_type(types, attrs):
    a, b = _tensors("batchMatmul", types)
    if a.dtype != b.dtype:
        _fail("batchMatmul", f"operands have different data types: {a}, {b}")
    if a.dtype is BOOL:
        _fail("batchMatmul", "bool operands")
    if not 3 <= a.rank <= MAX_BATCH_MATMUL_RANK or a.rank != b.rank:
        _fail(
            "batchMatmul",
            f"expected operands of one rank from 3 to {MAX_BATCH_MATMUL_RANK}, got {a} and {b}",
        )
    if a.shape[:-2] != b.shape[:-2]:
        _fail("batchMatmul", f"batch dimensions differ: {a} and {b} (broadcast them first)")
    if a.shape[-1] != b.shape[-2]:
        _fail(
            "batchMatmul",
            f"contracted dimensions differ: {a} · {b} ({a.shape[-1]} vs {b.shape[-2]})",
        )
    return TensorType(a.shape[:-1] + b.shape[-1:], a.dtype)


def _index_operand(op: str, x: TensorType, ids: TensorType, axis: int) -> None:
    if ids.dtype is not DType.i32 or ids.rank != 1 or ids.size == 0:
        _fail(op, f"indices must be a non-empty vector of i32, got {ids}")
    if not 0 <= axis < x.rank:
        _fail(op, f"axis {axis} out of range for {x}")


def _take_type(types, attrs):
    x, ids = _tensors("take", types)
    k = attrs["axis"]
    _index_operand("take", x, ids, k)
    return x.with_shape(x.shape[:k] + ids.shape + x.shape[k + 1 :])


def _scatter_add_type(types, attrs):
    g, ids = _tensors("scatterAdd", types)
    k, size = attrs["axis"], attrs["size"]
    _index_operand("scatterAdd", g, ids, k)
    if g.dtype is BOOL:
        _fail("scatterAdd", "bool values")
    if g.shape[k] != ids.size:
        _fail("scatterAdd", f"{ids.size} indices for axis {k} of {g}")
    if size < 1:
        _fail("scatterAdd", f"size {size} along axis {k} is not positive")
    return g.with_shape(g.shape[:k] + (size,) + g.shape[k + 1 :])


def checked_indices(op: str, ids: np.ndarray, size: int) -> np.ndarray:
    """ids as intp, or an IRError naming the first index outside [0, size)."""
    bad = np.flatnonzero((ids < 0) | (ids >= size))
    if bad.size:
        _fail(
            op,
            f"index {int(ids[bad[0]])} (position {int(bad[0])}) is out of range for an axis "
            f"of size {size}",
        )
    return ids.astype(np.intp)


def _take(args, attrs):
    x, ids = args
    k = attrs["axis"]
    return np.take(x, checked_indices("take", ids, x.shape[k]), axis=k)


def _scatter_add(args, attrs):
    g, ids = args
    k, size = attrs["axis"], attrs["size"]
    out = np.zeros(g.shape[:k] + (size,) + g.shape[k + 1 :], g.dtype)
    np.add.at(out, (slice(None),) * k + (checked_indices("scatterAdd", ids, size),), g)
    return out


def _slice_scatter_type(types, attrs):
    (g,) = _tensors("sliceScatter", types)
    k, lo, step, size = attrs["axis"], attrs["lo"], attrs["step"], attrs["size"]
    if not 0 <= k < g.rank:
        _fail("sliceScatter", f"axis {k} out of range for {g}")
    if step < 1:
        _fail("sliceScatter", f"step {step} is not positive")
    if g.dtype is BOOL:
        _fail("sliceScatter", "bool values")
    last = lo + (g.shape[k] - 1) * step
    if last >= size:
        _fail("sliceScatter", f"{g.shape[k]} entries from {lo} by {step} do not fit in size {size}")
    return g.with_shape(g.shape[:k] + (size,) + g.shape[k + 1 :])


def scatter_slice(g: np.ndarray, attrs: dict) -> tuple:
    """(result shape, numpy index of g's entries in it) of a sliceScatter."""
    k, lo, step = attrs["axis"], attrs["lo"], attrs["step"]
    hi = lo + (g.shape[k] - 1) * step + 1
    return g.shape[:k] + (attrs["size"],) + g.shape[k + 1 :], (slice(None),) * k + (
        slice(lo, hi, step),
    )


def _slice_scatter(args, attrs):
    (g,) = args
    shape, index = scatter_slice(g, attrs)
    out = np.zeros(shape, g.dtype)
    out[index] = g
    return out


def _cumsum_type(types, attrs):
    (a,) = _tensors("cumsum", types)
    if not 0 <= attrs["axis"] < a.rank:
        _fail("cumsum", f"axis {attrs['axis']} out of range for {a}")
    if a.dtype is BOOL:
        _fail("cumsum", "bool operand; cast it with dataTypeCast first")
    if attrs["reverse"] not in (0, 1):
        _fail("cumsum", f"reverse must be 0 or 1, not {attrs['reverse']}")
    return a


def _cumsum(args, attrs):
    (x,) = args
    k = attrs["axis"]
    if attrs["reverse"]:
        return np.flip(np.cumsum(np.flip(x, k), axis=k, dtype=x.dtype), k).copy()
    return np.cumsum(x, axis=k, dtype=x.dtype)


# The adjoint rules swap the last two axes with one transpose rule per rank (rules/adjoint.egg),
# and verify-rules checks ranks up to 4; the DSL folds more batch dimensions into one.
MAX_BATCH_MATMUL_RANK = 4


# ---------------------------------------------------------------- the table


def _build_table() -> dict[str, OpSpec]:
    table: dict[str, OpSpec] = {}

    def add(spec: OpSpec):
        table[spec.name] = spec

    for name, fn in _UNARY_FNS.items():
        float_only = name not in _INT_OK_UNARY
        add(
            OpSpec(
                name,
                UNARY,
                1,
                _PASCAL(name),
                (lambda n, fo: lambda ts, at: _elementwise_type(n, ts, float_only=fo))(
                    name, float_only
                ),
                (lambda f: _errstate(lambda args, at: f(args[0])))(fn),
                float_only=float_only,
                nondiff_operands=(0,) if name in _PIECEWISE_CONSTANT else (),
            )
        )
    for name, fn in _BINARY_FNS.items():
        add(
            OpSpec(
                name,
                BINARY,
                2,
                _PASCAL(name),
                (lambda n: lambda ts, at: _elementwise_type(n, ts, float_only=(n == "power")))(
                    name
                ),
                (lambda f: _errstate(lambda args, at: f(*args)))(fn),
                float_only=(name == "power"),
            )
        )
    add(
        OpSpec(
            "divide",
            BINARY,
            2,
            "Divide",
            lambda ts, at: _elementwise_type("divide", ts),
            _errstate(_divide),
        )
    )
    for name, fn in _COMPARE_FNS.items():
        add(
            OpSpec(
                name,
                COMPARE,
                2,
                _PASCAL(name),
                (lambda n: lambda ts, at: _elementwise_type(n, ts, out_dtype=BOOL))(name),
                (lambda f: lambda args, at: f(*args))(fn),
                differentiable=False,
            )
        )
    for name, fn in _LOGIC_FNS.items():
        add(
            OpSpec(
                name,
                LOGIC,
                2,
                _PASCAL(name),
                (lambda n: lambda ts, at: _elementwise_type(n, ts, bool_only=True))(name),
                (lambda f: lambda args, at: f(*args))(fn),
                differentiable=False,
            )
        )
    add(
        OpSpec(
            "not",
            LOGIC,
            1,
            "Not",
            lambda ts, at: _elementwise_type("not", ts, bool_only=True),
            lambda args, at: np.logical_not(args[0]),
            differentiable=False,
        )
    )
    add(
        OpSpec(
            "select",
            SELECT,
            3,
            "Select",
            _select_type,
            lambda args, at: np.where(args[2], args[0], args[1]),
            nondiff_operands=(2,),
        )
    )
    add(OpSpec("dot", DOT, 2, "Dot", _dot_type, lambda args, at: np.matmul(args[0], args[1])))
    add(
        OpSpec(
            "transpose",
            LAYOUT,
            1,
            "Transpose",
            _transpose_type,
            lambda args, at: np.transpose(  # a copy; ascontiguousarray would make a scalar 1-D
                args[0], transpose_perm(args[0].ndim, at)
            ).copy(),
            attrs=("perm",),
        )
    )
    add(
        OpSpec(
            "reduce",
            REDUCE,
            1,
            "Reduce",
            _reduce_type,
            _errstate(_reduce),
            attrs=("combinator", "init", "axes"),
        )
    )
    add(
        OpSpec(
            "shapeCast",
            LAYOUT,
            1,
            "ShapeCast",
            _shape_cast_type,
            lambda args, at: np.reshape(args[0], tuple(at["shape"])),
            attrs=("shape",),
        )
    )
    add(
        OpSpec(
            "padShape",
            LAYOUT,
            1,
            "PadShape",
            _pad_shape_type,
            lambda args, at: np.expand_dims(args[0], at["at"]),
            attrs=("at",),
        )
    )
    add(
        OpSpec(
            "squeezeShape",
            LAYOUT,
            1,
            "SqueezeShape",
            _squeeze_shape_type,
            lambda args, at: np.squeeze(args[0], at["at"]),
            attrs=("at",),
        )
    )
    # Implicit broadcasts are explicit in the e-graph; the unloader may print them back as this op.
    add(
        OpSpec(
            "broadcast",
            LAYOUT,
            1,
            "Broadcast",
            _broadcast_type,
            lambda args, at: np.broadcast_to(args[0], tuple(at["shape"])).copy(),
            attrs=("shape",),
        )
    )
    add(OpSpec("dataTypeCast", CAST, 1, "DataTypeCast", _cast_type, _cast, attrs=("dtype",)))
    add(
        OpSpec(
            "concatenate",
            LAYOUT,
            None,
            "Concatenate",
            _concatenate_type,
            lambda args, at: np.concatenate(args, axis=at["axis"]),
            attrs=("axis",),
        )
    )
    # `slice %x: T along k from lo to hi [by s]`: x[..., lo:hi:s, ...] on axis k (lo < hi, s >= 1;
    # the attribute `step` is absent for 1). The e-graph spells a step > 1 StridedSlice.
    add(
        OpSpec(
            "slice",
            SLICE,
            1,
            "Slice",
            _slice_type,
            lambda args, at: args[0][slice_index(args[0].ndim, at)].copy(),
            attrs=("axis", "lo", "hi", "step"),
        )
    )
    add(
        OpSpec(
            "literal",
            LITERAL,
            0,
            "Const",
            _literal_type,
            _literal,
            attrs=("value", "type"),
            differentiable=False,
        )
    )
    # A tuple of values, spelled `literal (%a: T, %b: T)` in DLVM; only as a function result.
    add(OpSpec("tuple", TUPLE, None, "Tuple", _tuple_type, lambda args, at: tuple(args)))
    add(
        OpSpec(
            "extract",
            TUPLE,
            1,
            "Extract",
            _extract_type,
            lambda args, at: args[0][at["index"]],
            attrs=("index",),
        )
    )
    # ---- convolution and pooling (issue 14, part C): NCHW, torch's semantics, window_ops.py
    for name in window_ops.WINDOW_OPS:
        add(
            OpSpec(
                name,
                WINDOW,
                window_ops.ARITY[name],
                _PASCAL(name),
                (lambda n: lambda ts, at: window_ops.result_type(n, ts, at))(name),
                (lambda n: lambda args, at: window_ops.evaluate(n, np, args, at))(name),
                attrs=window_ops.attr_names(name),
                float_only=True,
                nondiff_operands=window_ops.NONDIFF.get(name, ()),
            )
        )
    # ---- end of convolution and pooling
    add(OpSpec("apply", CALL, None, "Apply", _apply_type, _unevaluable, attrs=("callee", "type")))
    # ---- issue 14 part B (batched matmul, ...): own block
    # `batchMatmul %a: <B.. x m x k x T>, %b: <B.. x k x n x T>`: one product per batch index;
    # batch dimensions equal (the DSL broadcasts them explicitly, numpy's rules), ranks 3 to 4
    add(
        OpSpec(
            "batchMatmul",
            DOT,
            2,
            "BatchMatmul",
            _batch_matmul_type,
            lambda args, at: np.matmul(args[0], args[1]),
        )
    )
    # `take %x: T, %ids: <n x i32> along k`: x[..., ids, ...] on axis k (numpy's take); indices
    # outside the axis are an error (checked_indices), in compiled code too
    add(
        OpSpec("take", GATHER, 2, "Take", _take_type, _take, attrs=("axis",), nondiff_operands=(1,))
    )
    # `scatterAdd %g: T, %ids: <n x i32> along k into size`: zeros of `size` along k, g[..., j, ...]
    # added at ids[j] (repeated indices accumulate): take's adjoint
    add(
        OpSpec(
            "scatterAdd",
            GATHER,
            2,
            "ScatterAdd",
            _scatter_add_type,
            _scatter_add,
            attrs=("axis", "size"),
            nondiff_operands=(1,),
        )
    )
    # `cumsum %x: T along k [reverse]`: running sums along axis k, from the end with `reverse`
    # (attribute reverse: bool); its adjoint is the cumsum the other way
    add(OpSpec("cumsum", SCAN, 1, "Cumsum", _cumsum_type, _cumsum, attrs=("axis", "reverse")))
    # `sliceScatter %g: T along k from lo by s into size`: zeros of `size` along k with g at
    # lo, lo + s, ...: a strided slice's adjoint
    add(
        OpSpec(
            "sliceScatter",
            SLICE,
            1,
            "SliceScatter",
            _slice_scatter_type,
            _slice_scatter,
            attrs=("axis", "lo", "step", "size"),
        )
    )
    # structured control flow (control_flow.py): bodies are functions, run by the interpreter
    for name in control_flow.CONTROL_FLOW_OPS:
        add(
            OpSpec(
                name,
                CONTROL,
                None,
                _PASCAL(name),
                control_flow.result_type(name),
                control_flow.unevaluable,
                attrs=control_flow.ATTRS[name],
            )
        )
    # ---- issue 33: fused attention (attention_op.py; derived by rules/attention.egg)
    add(
        OpSpec(
            "attention",
            ATTENTION,
            4,
            "Attention",
            attention_op.attention_type,
            attention_op.attention,
            attrs=("scale", "causal"),
            float_only=True,
            nondiff_operands=(3,),  # the bias is a mask (rules/attention_adjoint.egg)
        )
    )
    return table


OPS: dict[str, OpSpec] = _build_table()

UNARY_OPS = tuple(n for n, s in OPS.items() if s.kind == UNARY)
BINARY_OPS = tuple(n for n, s in OPS.items() if s.kind == BINARY)
COMPARE_OPS = tuple(n for n, s in OPS.items() if s.kind == COMPARE)
ELEMENTWISE_OPS = tuple(n for n, s in OPS.items() if s.kind in ELEMENTWISE_KINDS)


def lookup(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        raise IRError(f"unknown op {name!r}") from None
