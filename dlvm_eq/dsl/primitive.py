"""`bind`: apply one IR op to DSL operands, traced or concrete, with JAX-like dtype promotion.

Every DSL op ends here, so tracing and eager execution share one semantics: the op table's
result-type rule checks both, and eager mode computes with the op table's `evaluate`.

    bind("add", [x, 1.0])      # x traced f32 -> emits `add %x: <3 x f32>, 1.0: f32`
    bind("add", [a, 1.0])      # a numpy f32 array -> numpy f32 array, computed by OPS["add"]

Dtypes: traced tensors and numpy arrays are *strong*; Python and numpy scalars are *weak* and
take the strong operands' dtype (2.0 * f32 stays f32), unless their kind is higher (0.5 * i32
gives f32). Strong dtypes promote along bool < i32 < f32 < f64 with a `dataTypeCast`.
An op on weak scalars alone (eagerly, `dq.exp(1.0)`) computes in f64 and returns a numpy
scalar, which stays weak: `dq.exp(1.0) * x_f32` is f32, rounded once.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import DlvmError, IRError
from ..ir.module import Const, Value
from ..ir.ops import OPS
from ..ir.types import BOOL, F32, F64, I32, DType, TensorType, Type
from .context import current_trace, operand_error, shape_error, tracing_error, user_location
from .tensor import Tensor

_ORDER = {BOOL: 0, I32: 1, F32: 2, F64: 3}
_KIND_DEFAULT = {0: BOOL, 1: I32, 2: F32, 3: F64}
_NAMES = {
    "f32": F32,
    "float32": F32,
    "f64": F64,
    "float64": F64,
    "i32": I32,
    "int32": I32,
    "int64": I32,
    "int": I32,
    "float": F32,
    "bool": BOOL,
}


def to_dtype(d) -> DType:
    """DType, "f32"/"float32", numpy dtypes and numpy scalar types -> DType."""
    if isinstance(d, DType):
        return d
    if isinstance(d, str):  # only our spellings and numpy's names: "f16" is numpy's float128
        if d not in _NAMES:
            raise DlvmError(f"not a dtype: {d!r} (expected f32, f64, i32 or bool)")
        return _NAMES[d]
    if d is float:
        return F32
    if d is int:
        return I32
    if d is bool:
        return BOOL
    try:
        return DType.from_numpy(d)
    except (TypeError, ValueError):
        raise DlvmError(f"not a dtype: {d!r} (expected f32, f64, i32 or bool)") from None


def is_weak(x) -> bool:
    return isinstance(x, (bool, numbers.Number, np.generic)) and not isinstance(x, Tensor)


def _weak_kind(x) -> int:
    if isinstance(x, (bool, np.bool_)):
        return 0
    if isinstance(x, (numbers.Integral, np.integer)):
        return 1
    if isinstance(x, (numbers.Real, np.floating)):
        return 2
    raise tracing_error(f"unsupported operand {x!r} of type {type(x).__name__}")


def check_operand(x) -> None:
    """`x` is a traced tensor, a number, an array or what numpy reads as a numeric array;
    else an OperandError (numpy would read None or a dict as an object array of shape ())."""
    if isinstance(x, (Tensor, np.ndarray)) or is_weak(x):
        return
    if hasattr(x, "shape") and hasattr(x, "dtype"):  # jax/cupy arrays, specs
        return
    if x is None or isinstance(x, (dict, str, bytes)) or np.asarray(x).dtype.kind in "OSUV":
        raise operand_error(x)


def dtype_of(x) -> DType:
    """The (strong) dtype of a traced tensor or concrete array."""
    if isinstance(x, Tensor):
        return x.value.tensor_type.dtype
    check_operand(x)
    a = np.asarray(x)
    try:
        return DType.from_numpy(a.dtype)
    except ValueError:
        raise DlvmError(
            f"arrays of dtype {a.dtype} are not supported (f32, f64, i32, bool)"
        ) from None


def promote(operands, float_result: bool = False) -> DType:
    """The dtype all `operands` are computed in (see the module docstring)."""
    strong = [_ORDER[dtype_of(x)] for x in operands if not is_weak(x)]
    weak = [_weak_kind(x) for x in operands if is_weak(x)]
    if strong:
        rank = max(strong + weak)  # weak kinds stop at float: they never widen f32 to f64
    else:
        rank = max(weak, default=2)
    if float_result and rank < 2:
        rank = 2
    return _KIND_DEFAULT[rank]


def bind(
    op: str,
    operands,
    name: str | None = None,
    promote_only=None,
    float_result: bool = False,
    **attrs,
):
    """Apply IR op `op`; `name` is the user-facing op name for errors; `promote_only` lists the
    operand positions that share one promoted dtype (default: all); `float_result` promotes
    integers to f32 first (true division, exp, ...)."""
    positions = range(len(operands)) if promote_only is None else promote_only
    target = promote([operands[i] for i in positions], float_result) if positions else None
    all_weak = bool(operands) and all(is_weak(x) for x in operands)
    if all_weak and target is F32:
        target = F64
    dtypes = [target if i in positions else None for i in range(len(operands))]
    trace = current_trace()
    traced = any(isinstance(x, Tensor) for x in operands)
    loc = user_location()
    if traced:
        ins = [_lift(x, d, trace, loc) for x, d in zip(operands, dtypes)]
        assert trace is not None  # _lift refused a tensor whose trace has ended
        try:
            value = trace.builder.emit(op, ins, location=loc, **attrs)
        except IRError as e:
            raise _shape_error(name or op, op, [o.type for o in ins], e, loc) from None
        return Tensor(value, trace)
    arrays = [_concrete(x, d) for x, d in zip(operands, dtypes)]
    types: list[Type] = [TensorType(a.shape, DType.from_numpy(a.dtype)) for a in arrays]
    try:
        rtype = OPS[op].result_type(types, attrs)
    except IRError as e:
        raise _shape_error(name or op, op, types, e, loc) from None
    assert isinstance(rtype, TensorType)  # an op on arrays gives one array
    out = np.asarray(OPS[op].evaluate(arrays, attrs)).astype(rtype.dtype.numpy, copy=False)
    return out[()] if all_weak else out


def _shape_error(name: str, op: str, types, err: IRError, loc):
    detail = str(err)
    if detail.startswith(op + ": "):
        detail = detail[len(op) + 2 :]
    shapes = " and ".join(str(t.shape) for t in types)
    what = f"{name} of shapes {shapes}" if types else name
    return shape_error(f"{what}: {detail}", loc)


def _lift(x, dtype: DType | None, trace, loc):
    """A traced tensor, scalar or array -> an IR operand of `dtype` in `trace`."""
    if isinstance(x, Tensor):
        value = own_value(x, trace)
        if dtype is not None and value.tensor_type.dtype is not dtype:
            value = trace.builder.emit("dataTypeCast", [value], location=loc, dtype=dtype)
        return value
    if is_weak(x):
        return Const.of(x, dtype or promote([x]))
    a = np.asarray(x)
    dtype = dtype or dtype_of(a)
    if a.ndim == 0:
        return Const.of(a.item(), dtype)
    return trace.literal(a if isinstance(x, np.ndarray) else np.array(a), dtype, loc)


def own_value(x: Tensor, trace) -> Value:
    """The IR value of `x` in `trace`: its own, or captured from an enclosing trace (a closure
    over an outer traced value); a value whose trace has ended is an error (it escaped)."""
    if x.trace is trace:
        return x.value
    if not x.trace.active:
        raise tracing_error(
            f"the traced value {x.value!r} escaped the trace that made it "
            "(stored in a global or returned through a side channel?)"
        )
    return trace.capture(x)


def _concrete(x, dtype: DType | None) -> np.ndarray:
    if dtype is None:
        dtype = (F64 if promote([x]) is F32 else promote([x])) if is_weak(x) else dtype_of(x)
    return np.asarray(x, dtype=dtype.numpy)


def lift_value(x, trace=None) -> Value:
    """Any DSL operand as a Value of the current trace (emits a literal for constants)."""
    trace = trace or current_trace()
    loc = user_location()
    operand = _lift(x, None, trace, loc)
    if isinstance(operand, Const):
        operand = trace.builder.emit(
            "literal", [], location=loc, value=operand.value, type=operand.type
        )
    return operand
